"""The compiled loops over one class's images (numba, no GIL: classes run side by side in threads).

The build reads a class's images from the scene index (:mod:`shiftbench.metashift.index`):

- :func:`count_contexts`: how many of the class's images show each context of one kind (a candidate subset's
  size), by one pass over its images' context lists into a counter array (:func:`count_attributes`: the same
  over a class's (image, attribute) pairs; the two stay apart: count_attributes as count_contexts over one row
  measured 5% slower, a shared tally helper twice as slow);
- :func:`cooccurrences`: for the class's selected subsets (local numbers 0..k-1), how many images each pair
  shares, by one pass over its images: every pair of selected contexts of an image adds one to a k x k
  matrix. This is |X ∩ Y| for every pair at once, the numerator of the overlap coefficient, in
  sum over images of (selected contexts of the image)² / 2 increments, where a sparse product MᵀM costs the
  same products through an index structure.

The contract check counts the same again from a version's stored tables (:func:`recount_class`, for
:mod:`shiftbench.metashift.checks`): it looks an image's subsets up in what the version stores, not in the
build's index, and shares with the build only the mechanics below (an image's attribute rows, sorting its few
subset numbers, counting their pairs). They live in this one file on purpose: numba's cache of a function is
refreshed when the file holding it changes, not when a function it calls changes in another file.
"""

from __future__ import annotations

import numpy as np

from shiftbench.metashift.compiled import njit_cached


@njit_cached
def count_contexts(
    class_images: np.ndarray,
    offsets: np.ndarray,
    values: np.ndarray,
    excluded: np.ndarray,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(codes, sizes) of the contexts of one kind the class's images show, codes sorted; ``excluded`` codes are
    skipped. ``counts`` is a zeroed array as long as the vocabulary (left zeroed again)."""
    for e in excluded:
        counts[e] = -1
    seen = np.empty(0, dtype=np.int64)
    n_seen = 0
    for image in class_images:
        for k in range(offsets[image], offsets[image + 1]):
            code = values[k]
            if counts[code] < 0:
                continue
            if counts[code] == 0:
                if n_seen == len(seen):
                    grown = np.empty(max(16, 2 * len(seen)), dtype=np.int64)
                    grown[:n_seen] = seen[:n_seen]
                    seen = grown
                seen[n_seen] = code
                n_seen += 1
            counts[code] += 1
    codes = np.sort(seen[:n_seen])
    sizes = np.empty(n_seen, dtype=np.int64)
    for k in range(n_seen):
        sizes[k] = counts[codes[k]]
        counts[codes[k]] = 0
    for e in excluded:
        counts[e] = 0
    return codes, sizes


@njit_cached
def count_attributes(codes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, sizes) of a class's attributes from its (image, attribute) pairs (each pair once)."""
    seen = np.empty(0, dtype=np.int64)
    n_seen = 0
    for code in codes:
        if counts[code] == 0:
            if n_seen == len(seen):
                grown = np.empty(max(16, 2 * len(seen)), dtype=np.int64)
                grown[:n_seen] = seen[:n_seen]
                seen = grown
            seen[n_seen] = code
            n_seen += 1
        counts[code] += 1
    ordered = np.sort(seen[:n_seen])
    sizes = np.empty(n_seen, dtype=np.int64)
    for k in range(n_seen):
        sizes[k] = counts[ordered[k]]
        counts[ordered[k]] = 0
    return ordered, sizes


@njit_cached(inline=True)
def _attribute_numbers(
    image: int,
    a: int,
    attribute_images: np.ndarray,
    attributes: np.ndarray,
    local: np.ndarray,
    numbers: np.ndarray,
    n: int,
) -> tuple[int, int]:
    """Append to ``numbers[:n]`` the subset numbers (``local[attribute]``, -1: none) of ``image``'s attribute rows,
    from row ``a`` of rows sorted by image; returns the next row and the new count."""
    while a < len(attribute_images) and attribute_images[a] < image:
        a += 1
    while a < len(attribute_images) and attribute_images[a] == image:
        number = local[attributes[a]]
        if number >= 0:
            numbers[n] = number
            n += 1
        a += 1
    return a, n


@njit_cached(inline=True)
def _count_pairs(numbers: np.ndarray, n: int, shared: np.ndarray) -> None:
    """Add one to ``shared[x, y]`` for every pair x < y of an image's subset numbers ``numbers[:n]`` (sorted here,
    in place: an insertion sort of a handful of numbers, where np.sort would allocate)."""
    for x in range(1, n):
        value = numbers[x]
        y = x - 1
        while y >= 0 and numbers[y] > value:
            numbers[y + 1] = numbers[y]
            y -= 1
        numbers[y + 1] = value
    for x in range(n - 1):
        row = numbers[x]
        for y in range(x + 1, n):
            shared[row, numbers[y]] += 1


@njit_cached
def cooccurrences(
    class_images: np.ndarray,
    object_offsets: np.ndarray,
    objects: np.ndarray,
    object_local: np.ndarray,
    general_offsets: np.ndarray,
    general: np.ndarray,
    general_local: np.ndarray,
    attribute_images: np.ndarray,
    attributes: np.ndarray,
    attribute_local: np.ndarray,
    k: int,
) -> np.ndarray:
    """The k x k matrix of shared images of the class's selected subsets (upper triangle: row < column).

    ``*_local`` map a context code of each kind to its subset's local number, or -1 when the subset is not
    selected; ``attribute_images``/``attributes`` are the class's (image, attribute) pairs sorted by image.
    """
    shared = np.zeros((k, k), dtype=np.int32)
    buffer = np.empty(k, dtype=np.int64)
    a = 0
    for image in class_images:
        n = 0
        for j in range(object_offsets[image], object_offsets[image + 1]):
            local = object_local[objects[j]]
            if local >= 0:
                buffer[n] = local
                n += 1
        for j in range(general_offsets[image], general_offsets[image + 1]):
            local = general_local[general[j]]
            if local >= 0:
                buffer[n] = local
                n += 1
        a, n = _attribute_numbers(image, a, attribute_images, attributes, attribute_local, buffer, n)
        if n >= 2:
            _count_pairs(buffer, n, shared)
    return shared


@njit_cached
def recount_class(
    images: np.ndarray,
    tag_offsets: np.ndarray,
    tags: np.ndarray,
    tag_kinds: np.ndarray,
    attribute_images: np.ndarray,
    attributes: np.ndarray,
    local: np.ndarray,
    k: int,
    pairs: np.ndarray,
) -> np.ndarray:
    """Sizes of a class's k selected subsets over its ``images``, and their shared images into ``pairs`` (k x k,
    upper triangle; 0 x 0: not counted), from a version's stored rows: an image's tags (``local[kind, tag]`` is the
    subset's number or -1) and the class's (image, attribute) rows sorted by image (``local[2, attribute]``)."""
    sizes = np.zeros(k, dtype=np.int64)
    found = np.empty(k, dtype=np.int64)
    attribute_local = local[2]
    a = 0
    for image in images:
        n = 0
        for j in range(tag_offsets[image], tag_offsets[image + 1]):
            number = local[tag_kinds[j], tags[j]]
            if number >= 0:
                found[n] = number
                n += 1
        a, n = _attribute_numbers(image, a, attribute_images, attributes, attribute_local, found, n)
        for x in range(n):
            sizes[found[x]] += 1
        if pairs.shape[0] > 0 and n >= 2:
            _count_pairs(found, n, pairs)
    return sizes
