// FUZZ_CHECK(cond): a fuzz target's property check; aborts (libFuzzer reports the input) when it
// fails, in every build type (unlike FLUXON_DCHECK, which release builds compile out).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
