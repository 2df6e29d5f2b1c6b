// The CHECK macro of the host C++ tests (tests/cpp/*.cpp): counts every check and each failure,
// and prints the first 40 failures with their condition and a message.
#pragma once
#include <cstdio>

static int failures = 0;
static long checks = 0;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        ++checks;                                                            \
        if (!(cond) && ++failures <= 40) {                                   \
            std::printf("FAIL %s:%d: %s | ", __FILE__, __LINE__, #cond);     \
            std::printf(__VA_ARGS__);                                        \
            std::printf("\n");                                               \
        }                                                                    \
    } while (0)
