"""Raw sources, read: WordNet and the ImageNet hierarchy (``wordnet``, ``imagenet``, ``imagenet21k``,
``breeds_hierarchy``, ``labelled_hierarchy``), class hierarchies as graphs (``hierarchy``) and BREEDS' calibration as
an edit file (``calibration``), Visual Genome/GQA scene graphs (``scene_graphs``, ``gqa_*``, ``scene_codes``,
``generated_scenes``), CelebA and attribute tables (``celeba``, ``attribute_tables``), the generated sprites
(``sprites``) and the data shipped in the package (``packaged``). A family's inputs are built from these.

May import: errors, runtime, tables, config, store, specs.
"""
