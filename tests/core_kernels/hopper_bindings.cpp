// Python bindings of the Hopper core test kernels (tests/test_core_hopper_gpu.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "hopper_launchers.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "ThunderKittens Hopper tile-core test kernels";
    m.def("tma_round_trip", &tk_test::tma_round_trip);
    m.def("wgmma", &tk_test::wgmma);
    m.def("semaphore_pipeline", &tk_test::semaphore_pipeline);
    m.def("multicast_pipeline", &tk_test::multicast_pipeline);
    m.def("bulk_copy", &tk_test::bulk_copy);
    m.def("cluster_exchange", &tk_test::cluster_exchange);
}
