"""``shiftbench generate metashift-dg``: a distance-controlled task spec from the scenes its contexts need."""

from __future__ import annotations

from shiftbench import benchmark_builds
from shiftbench.metashift import family as metashift
from shiftbench.metashift.generate import DgRequest, GeneratedTask, generate_dg
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import load_specs
from shiftbench.settings import Settings


def generate_task(settings: Settings, request: DgRequest) -> GeneratedTask:
    """A distance-controlled MetaShift domain-generalization task, from the scenes the request's contexts need:
    the released attribute annotations when only attributes are asked for and no GQA scene graphs are set, else
    the scene graphs (built first if not cached)."""
    own = settings.of(MetaShiftSettings)
    released = request.context_kinds == ("attribute",) and not own.gqa_scene_graphs
    scenes_input = metashift.RELEASED if released else metashift.SCENES
    artifact = benchmark_builds.build_inputs(settings, metashift.METASHIFT, [scenes_input.name])[scenes_input.name]
    objects, images = metashift.read_scenes(artifact)
    source = f"{artifact.meta['dataset']} ({artifact.meta['kind']}, {artifact.fingerprint[:16]})"
    return generate_dg(objects, images, load_specs(own.metashift_specs).general_contexts, request, source)
