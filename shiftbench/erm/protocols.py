"""The papers' image protocols as data: each a training transform, an evaluation transform and where they come from.

A protocol is what a paper's loader does to a photograph before the network sees it. Each is written down once here,
with the reference file it is taken from, and implemented once (:mod:`shiftbench.erm.photo_draws` draws the random
parameters with torch, :mod:`shiftbench.erm.photo_pixels` applies them with Pillow: the training job has no
torchvision); ``tests/test_photo_transforms.py`` checks the implementation against the reference objects themselves
on real photographs. The normalisation is the run's (``normalization``: the dataset's
mean and std, :mod:`shiftbench.erm.data`), so a preset names both.

- ``robustness_imagenet``: the BREEDS authors' ``robustness`` library (1.2.1.post2),
  ``robustness/data_augmentation.py``, ``TRAIN_TRANSFORMS_IMAGENET`` and ``TEST_TRANSFORMS_IMAGENET``, which its
  ``CustomImageNet`` (the BREEDS datasets) trains and evaluates with: RandomResizedCrop(224) (scale 0.08-1, ratio
  3/4-4/3), horizontal flip (p 1/2), ColorJitter(brightness 0.1, contrast 0.1, saturation 0.1), ToTensor, AlexNet's
  PCA lighting noise (std 0.05); evaluation Resize(256) (the shorter side), CenterCrop(224).
- ``domainbed``: DomainBed's ``domainbed/datasets.py`` (``MultipleEnvironmentImageFolder``), which MetaShift's
  experiments use (MetaShift Appendix B.1): RandomResizedCrop(224, scale 0.7-1), horizontal flip, ColorJitter(0.3,
  0.3, 0.3, 0.3), RandomGrayscale (p 0.1); evaluation Resize((224, 224)): the whole image to a square.

``square`` (the default) is no paper's protocol: the whole image resized to ``image_size`` on both paths, then
``augment`` on the device. It is what runs on generated images (the ConDS sprites, the stand-ins) use, unchanged.

Pure data: no torch, no Pillow.
"""

from __future__ import annotations

from dataclasses import dataclass

# AlexNet's PCA of ImageNet's RGB pixels (Krizhevsky et al. 2012), the constants the robustness library's Lighting
# transform uses (robustness/data_augmentation.py, IMAGENET_PCA): eigenvalues, then eigenvectors as columns.
PCA_EIGVAL = (0.2175, 0.0188, 0.0045)
PCA_EIGVEC = ((-0.5675, 0.7192, 0.4009), (-0.5808, -0.0045, -0.8140), (-0.5836, -0.6948, 0.4203))


@dataclass(frozen=True)
class Jitter:
    """ColorJitter's ranges (torchvision: a factor drawn uniformly in each, the four applied in a random order)."""

    brightness: tuple[float, float] | None
    contrast: tuple[float, float] | None
    saturation: tuple[float, float] | None
    hue: tuple[float, float] | None


@dataclass(frozen=True)
class TrainTransform:
    """A random resized crop of the image at its own aspect ratio, then flips, colour and lighting noise."""

    scale: tuple[float, float]  # of the image's area
    ratio: tuple[float, float]  # width / height
    flip: float  # probability of a horizontal flip
    jitter: Jitter | None
    grey: float  # probability of greyscale (three equal channels)
    lighting: float  # standard deviation of AlexNet's PCA lighting noise (0: none)


@dataclass(frozen=True)
class EvalTransform:
    """``shorter``: the shorter side resized to ``size * resize / crop``, then the centre ``size`` square (Resize(256),
    CenterCrop(224) at 224); ``square``: the whole image resized to ``size`` x ``size`` (Resize((224, 224)))."""

    resize: str  # shorter | square
    resize_to: int = 256  # the shorter side at the reference crop (224)
    crop: int = 224


@dataclass(frozen=True)
class Protocol:
    name: str
    train: TrainTransform
    eval: EvalTransform
    reference: str  # the file (and objects) of the reference implementation

    def eval_resize(self, size: int) -> int:
        """The shorter side before the centre crop, for a run of ``size`` pixels (256 at 224)."""
        return round(size * self.eval.resize_to / self.eval.crop)


PROTOCOLS = {
    "robustness_imagenet": Protocol(
        "robustness_imagenet",
        TrainTransform(
            scale=(0.08, 1.0),
            ratio=(3 / 4, 4 / 3),
            flip=0.5,
            jitter=Jitter((0.9, 1.1), (0.9, 1.1), (0.9, 1.1), None),
            grey=0.0,
            lighting=0.05,
        ),
        EvalTransform("shorter"),
        "robustness 1.2.1.post2, robustness/data_augmentation.py: TRAIN_TRANSFORMS_IMAGENET, TEST_TRANSFORMS_IMAGENET",
    ),
    "domainbed": Protocol(
        "domainbed",
        TrainTransform(
            scale=(0.7, 1.0),
            ratio=(3 / 4, 4 / 3),
            flip=0.5,
            jitter=Jitter((0.7, 1.3), (0.7, 1.3), (0.7, 1.3), (-0.3, 0.3)),
            grey=0.1,
            lighting=0.0,
        ),
        EvalTransform("square"),
        "DomainBed, domainbed/datasets.py: MultipleEnvironmentImageFolder's augment_transform and transform",
    ),
}
TRANSFORMS = ("square", *PROTOCOLS)
