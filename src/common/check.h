// FLUXON_DCHECK(cond, message): an invariant check that aborts with the message (and where it
// failed) in debug and sanitizer builds, and compiles to nothing in release builds. For states
// the code relies on but cannot recover from ("a slot promoted twice"), not for input errors,
// which are always returned as a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

#if !defined(NDEBUG) || defined(FLUXON_ENABLE_DCHECK)
#define FLUXON_DCHECK(cond, message)                                                          \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: invariant violated: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   message);                                                                  \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)
#else
#define FLUXON_DCHECK(cond, message) \
  do {                               \
    (void)sizeof(cond);              \
  } while (0)
#endif
