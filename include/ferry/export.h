/* export.h - FERRY_API, the mark of a function or variable that libferry publishes.
 * libferry's objects are compiled with -fvisibility=hidden: only what the public
 * headers declare with FERRY_API is in the shared library's dynamic symbol table,
 * and scripts/check-exports.py holds the two lists equal. Everything else (the
 * layers' internals, the generated protobuf-c code) stays private to the library. */
#ifndef FERRY_EXPORT_H
#define FERRY_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#endif /* FERRY_EXPORT_H */
