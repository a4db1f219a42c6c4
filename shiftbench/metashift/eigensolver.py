"""The smallest eigenpairs of a symmetric matrix, with Python's lock released while LAPACK works.

``scipy.linalg.eigh(a, subset_by_index=[0, k - 1], driver="evr")`` is the solver of the meta-graphs' embeddings
(LAPACK's MRRR, ``dsyevr``, asked for the k smallest eigenpairs only). scipy's wrapper holds the GIL for the whole
call, so classes built on threads wait for each other there: at GQA scale the 42 classes of 500 nodes or more took
as long on two threads as on one. This calls the same ``dsyevr`` of the same LAPACK (scipy's, through
``scipy.linalg.cython_lapack``) with the same arguments and workspace through ``ctypes``, which releases the GIL
during the call: the same floats (tested bit-identical to scipy's ``eigh``), computed side by side.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np
from scipy.linalg import cython_lapack
from scipy.linalg import lapack as scipy_lapack

_POINTER = ctypes.c_void_p
_ARGUMENTS = 21  # dsyevr(jobz, range, uplo, n, a, lda, vl, vu, il, iu, abstol, m, w, z, ldz, isuppz, work, lwork, ...)


@cache
def _dsyevr() -> Any:
    """scipy's ``dsyevr`` (the function behind ``scipy.linalg.cython_lapack.dsyevr``), callable from ctypes."""
    capsule = getattr(cython_lapack, "__pyx_capi__")["dsyevr"]  # noqa: B009 (no stubs name it)
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, get_name(capsule))
    return ctypes.CFUNCTYPE(None, *[_POINTER] * _ARGUMENTS)(address)


@cache
def _workspace(n: int) -> tuple[int, int]:
    """The workspace scipy's ``eigh`` gives ``dsyevr`` for an n x n matrix (its own query, lower triangle)."""
    work, iwork, info = scipy_lapack.dsyevr_lwork(n, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"dsyevr's workspace query failed (info {info})")
    return int(work), int(iwork)


def smallest_eigenpairs(matrix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest eigenvalues (ascending) and their eigenvectors (columns) of the symmetric ``matrix``:
    what ``scipy.linalg.eigh(matrix, subset_by_index=[0, k - 1], driver="evr")`` returns, without the GIL."""
    n = matrix.shape[0]
    if matrix.shape != (n, n) or not 1 <= k <= n:
        raise ValueError(f"need a square matrix and 1 <= k <= n, got {matrix.shape} and k={k}")
    a = np.array(matrix, dtype=np.float64, order="F")  # overwritten by LAPACK
    lwork, liwork = _workspace(n)
    values = np.zeros(n, dtype=np.float64)
    vectors = np.zeros((n, k), dtype=np.float64, order="F")
    isuppz = np.zeros(2 * n, dtype=np.int32)
    work = np.zeros(max(lwork, 1), dtype=np.float64)
    iwork = np.zeros(max(liwork, 1), dtype=np.int32)
    size, lower_index, upper_index = ctypes.c_int(n), ctypes.c_int(1), ctypes.c_int(k)  # il, iu: 1-based
    unused_low, unused_high, abstol = ctypes.c_double(0.0), ctypes.c_double(1.0), ctypes.c_double(0.0)
    work_size, iwork_size = ctypes.c_int(lwork), ctypes.c_int(liwork)
    found, info = ctypes.c_int(0), ctypes.c_int(0)
    _dsyevr()(
        b"V",  # eigenvectors too
        b"I",  # by index: il..iu
        b"L",  # the lower triangle (scipy's default)
        ctypes.byref(size),
        a.ctypes.data,
        ctypes.byref(size),  # lda
        ctypes.byref(unused_low),
        ctypes.byref(unused_high),
        ctypes.byref(lower_index),
        ctypes.byref(upper_index),
        ctypes.byref(abstol),
        ctypes.byref(found),
        values.ctypes.data,
        vectors.ctypes.data,
        ctypes.byref(size),  # ldz
        isuppz.ctypes.data,
        work.ctypes.data,
        ctypes.byref(work_size),
        iwork.ctypes.data,
        ctypes.byref(iwork_size),
        ctypes.byref(info),
    )
    if info.value != 0 or found.value != k:
        raise np.linalg.LinAlgError(f"dsyevr failed (info {info.value}, {found.value} of {k} eigenvalues)")
    return values[:k].copy(), vectors
