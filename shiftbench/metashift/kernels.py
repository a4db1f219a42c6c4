"""The compiled loops of a class's work (numba, no GIL: classes run side by side in threads).

Both loops read one class's images from the scene index (:mod:`shiftbench.metashift.index`):

- :func:`count_contexts`: how many of the class's images show each context of one kind (a candidate subset's
  size), by one pass over its images' context lists into a counter array;
- :func:`cooccurrences`: for the class's selected subsets (local numbers 0..k-1), how many images each pair
  shares, by one pass over its images: every pair of selected contexts of an image adds one to a k x k
  matrix. This is |X ∩ Y| for every pair at once, the numerator of the overlap coefficient, in
  sum over images of (selected contexts of the image)² / 2 increments, where a sparse product MᵀM costs the
  same products through an index structure.
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
    n_attributes = len(attribute_images)
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
        while a < n_attributes and attribute_images[a] < image:
            a += 1
        while a < n_attributes and attribute_images[a] == image:
            local = attribute_local[attributes[a]]
            if local >= 0:
                buffer[n] = local
                n += 1
            a += 1
        if n < 2:
            continue
        for x in range(1, n):  # insertion sort of an image's few numbers, in place (np.sort would allocate)
            value = buffer[x]
            y = x - 1
            while y >= 0 and buffer[y] > value:
                buffer[y + 1] = buffer[y]
                y -= 1
            buffer[y + 1] = value
        for x in range(n - 1):
            row = buffer[x]
            for y in range(x + 1, n):
                shared[row, buffer[y]] += 1
    return shared
