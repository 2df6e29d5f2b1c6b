// CPU unit tests of csrc/attention/head_dims.h (plain C++20, no nvcc): the one list of the head
// dims each attention kernel family is built for, read by the dispatch, the op checks and
// thunderkittens._C.attention_head_dims.
//
// Build: g++ -std=c++20 -I<repo> -I<repo>/csrc tests/cpp/test_head_dims.cpp  (tests/test_core_host.py)
#include <algorithm>
#include <cstdio>

#include "attention/head_dims.h"
#include "tests/cpp/check.h"

using namespace tk::attention;

// Sorted, distinct, whole 16-wide slices (the tile core's unit), and contains() agrees with the list.
template <typename Dims>
static void check_list(const char* family) {
    const auto& dims = Dims::values;
    CHECK(!dims.empty(), "%s: no head dims", family);
    for (size_t i = 0; i < dims.size(); ++i) {
        CHECK(dims[i] > 0 && dims[i] % 16 == 0, "%s: head dim %d", family, dims[i]);
        if (i > 0) CHECK(dims[i - 1] < dims[i], "%s: %d before %d", family, dims[i - 1], dims[i]);
    }
    for (int d = -1; d <= 512; ++d) {
        const bool listed = std::find(dims.begin(), dims.end(), d) != dims.end();
        CHECK(Dims::contains(d) == listed, "%s: contains(%d)", family, d);
    }
    CHECK(!Dims::contains(int64_t(64) + (int64_t(1) << 32)), "%s: no truncation to int", family);
}

int main() {
    check_list<Sm90HeadDims>("sm90");
    check_list<Sm80HeadDims>("sm80");
    // The values the Python package and the docs promise.
    CHECK((Sm90HeadDims::values == std::array<int, 3>{64, 96, 128}), "sm90 head dims");
    CHECK((Sm80HeadDims::values == std::array<int, 2>{64, 128}), "sm80 head dims");
    // The mma.sync forward's head dims are a subset of the sm90 kernels'.
    for (int d : Sm80HeadDims::values) CHECK(Sm90HeadDims::contains(d), "sm80 head dim %d not in sm90", d);
    std::printf("%ld checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
