# Third-party libraries, all through pkg-config (gRPC's CMake config is unusable on
# Debian 12: it demands the C++ plugins; libuv ships none).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(GRPC REQUIRED IMPORTED_TARGET grpc gpr)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd) # the daemons' /metrics
find_program(PROTOC_C protoc-c REQUIRED)
