// Python bindings of the core-op test extension. Only pybind11 (no torch headers):
// tensors cross as (data_ptr, sizes, strides) lists built by tests/test_core_gpu.py,
// which keeps this file a few seconds to compile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "launchers.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "ThunderKittens tile-core test kernels (tests/test_core_gpu.py)";
    m.def("roundtrip", &tk_test::roundtrip);
    m.def("register_global", &tk_test::register_global);
    m.def("vector_global", &tk_test::vector_global);
    m.def("last_arrival", &tk_test::last_arrival);
    m.def("part_roundtrip", &tk_test::part_roundtrip);
    m.def("tile_op", &tk_test::tile_op);
    m.def("convert", &tk_test::convert);
    m.def("mma", &tk_test::mma);
}
