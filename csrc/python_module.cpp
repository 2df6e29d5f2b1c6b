// The Python module thunderkittens._C. Importing it loads this shared library, whose static
// initialisers register the tk ops with the dispatcher (torch.ops.tk.*). The module itself only
// carries facts: what the binary was built with, so the Python side can tell whether a GPU is
// covered by the compiled targets and can report a build that does not match the installed
// torch, and the head dims of the attention kernels, defined once in C++ (head_dims.h).
// Plain CPython API: pybind11 / torch/extension.h are not needed for a few constants.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "attention/head_dims.h"
#ifdef TK_HAS_FFTCONV
#include "fftconv/params.h"
#endif

#ifndef TK_BUILD_ARCHS
#define TK_BUILD_ARCHS ""
#endif
#ifndef TK_BUILD_OPS
#define TK_BUILD_OPS ""
#endif
#ifndef TK_BUILD_TORCH
#define TK_BUILD_TORCH ""
#endif
#ifndef TK_BUILD_TORCH_CUDA
#define TK_BUILD_TORCH_CUDA ""
#endif

static PyModuleDef tk_module = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "thunderkittens compiled ops (registered as torch.ops.tk.*) and the facts of their build.",
    -1,
    nullptr,
};

namespace {

// A tuple of Python ints from a head dim list (head_dims.h); nullptr with an exception set on failure.
template <typename Dims>
PyObject* head_dim_tuple() {
    PyObject* tuple = PyTuple_New(Py_ssize_t(Dims::values.size()));
    if (tuple == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < Py_ssize_t(Dims::values.size()); ++i) {
        PyObject* value = PyLong_FromLong(Dims::values[size_t(i)]);
        if (value == nullptr) {
            Py_DECREF(tuple);
            return nullptr;
        }
        PyTuple_SET_ITEM(tuple, i, value);  // steals the reference
    }
    return tuple;
}

// {"sm90": (64, 96, 128), "sm80": (64, 128), "decode": (64, 96, 128)}: the head dims each attention
// kernel family is built for, whatever families this build compiled (TK_OPS), so Python has one
// source for them.
PyObject* attention_head_dims() {
    PyObject* dims = PyDict_New();
    if (dims == nullptr) return nullptr;
    const struct {
        const char* family;
        PyObject* (*make)();
    } families[] = {{"sm90", &head_dim_tuple<tk::attention::Sm90HeadDims>},
                    {"sm80", &head_dim_tuple<tk::attention::Sm80HeadDims>},
                    {"decode", &head_dim_tuple<tk::attention::DecodeHeadDims>}};
    for (const auto& entry : families) {
        PyObject* tuple = entry.make();
        if (tuple == nullptr || PyDict_SetItemString(dims, entry.family, tuple) < 0) {
            Py_XDECREF(tuple);
            Py_DECREF(dims);
            return nullptr;
        }
        Py_DECREF(tuple);
    }
    return dims;
}

// {fft_size: (bytes, bytes with a pregate, bytes of the filter gradient, the sm90 forward's bytes,
// its bytes with a pregate)}: the dynamic shared memory each FFT-conv kernel needs per block (more
// than a GPU's opt-in limit: it cannot run there); empty without that family.
PyObject* fftconv_shared_bytes() {
    PyObject* sizes = PyDict_New();
    if (sizes == nullptr) return nullptr;
#ifdef TK_HAS_FFTCONV
    for (int fft_size = 512; fft_size <= (1 << 20); fft_size *= 2) {
        const int plain = tk::fftconv::fftconv_fwd_sm80_shared_bytes(fft_size, false);
        if (plain == 0) continue;
        const int gated = tk::fftconv::fftconv_fwd_sm80_shared_bytes(fft_size, true);
        const int filter_grad = tk::fftconv::fftconv_filter_grad_sm80_shared_bytes(fft_size);
        PyObject* key = PyLong_FromLong(fft_size);
        PyObject* value = Py_BuildValue("(iiiii)", plain, gated, filter_grad,
                                        tk::fftconv::fftconv_fwd_sm90_shared_bytes(fft_size, false),
                                        tk::fftconv::fftconv_fwd_sm90_shared_bytes(fft_size, true));
        if (key == nullptr || value == nullptr || PyDict_SetItem(sizes, key, value) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_DECREF(sizes);
            return nullptr;
        }
        Py_DECREF(key);
        Py_DECREF(value);
    }
#endif
    return sizes;
}

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
    PyObject* module = PyModule_Create(&tk_module);
    if (module == nullptr) return nullptr;
    // Comma-separated lists: CUDA targets ("80,89,90a", "80+PTX") and op families.
    if (PyModule_AddStringConstant(module, "cuda_archs", TK_BUILD_ARCHS) < 0 ||
        PyModule_AddStringConstant(module, "ops", TK_BUILD_OPS) < 0 ||
        PyModule_AddStringConstant(module, "torch_version", TK_BUILD_TORCH) < 0 ||
        PyModule_AddStringConstant(module, "torch_cuda_version", TK_BUILD_TORCH_CUDA) < 0) {
        Py_DECREF(module);
        return nullptr;
    }
    PyObject* head_dims = attention_head_dims();
    if (head_dims == nullptr || PyModule_AddObject(module, "attention_head_dims", head_dims) < 0) {
        Py_XDECREF(head_dims);  // PyModule_AddObject steals the reference only on success
        Py_DECREF(module);
        return nullptr;
    }
    PyObject* fft_bytes = fftconv_shared_bytes();
    if (fft_bytes == nullptr || PyModule_AddObject(module, "fftconv_shared_bytes", fft_bytes) < 0) {
        Py_XDECREF(fft_bytes);
        Py_DECREF(module);
        return nullptr;
    }
    return module;
}
