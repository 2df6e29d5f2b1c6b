// The Python module thunderkittens._C. Importing it loads this shared library, whose static
// initialisers register the tk ops with the dispatcher (torch.ops.tk.*). The module itself only
// carries what the binary was built with, so the Python side can tell whether a GPU is covered
// by the compiled targets and can report a build that does not match the installed torch.
// Plain CPython API: pybind11 / torch/extension.h are not needed for four string constants.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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
    return module;
}
