/* bf16.c - bfloat16 conversions of whole arrays, for the wire (little-endian pairs of
 * bytes) and for the dense kind's images. Each element as ferry_rpc_f32_to_bf16 and
 * ferry_rpc_bf16_to_f32 convert it; written without branches and in blocks through an
 * aligned scratch array, so that the compiler turns the loops into vector code (the
 * NaN test is a select). This file is compiled with -O3 (common/CMakeLists.txt). */
#include <string.h>

#include "common/core/simd.h"
#include "common/rpc/rpc.h"

enum { BF16_BLOCK = 512 };

FERRY_HOT_LOOP void ferry_rpc_bf16_narrow(void *dst, const float *src, size_t n) {
    uint8_t *out = dst;
    uint16_t h[BF16_BLOCK];
    uint32_t u[BF16_BLOCK];
    while (n > 0) {
        size_t k = n < BF16_BLOCK ? n : BF16_BLOCK;
        memcpy(u, src, k * sizeof *u);
        for (size_t i = 0; i < k; i++) {
            uint32_t x = u[i];
            uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
            uint32_t quiet = (x >> 16) | 0x0040u;
            h[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
        }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(out, h, k * sizeof *h);
#else
        for (size_t i = 0; i < k; i++) {
            out[2 * i] = (uint8_t)h[i];
            out[2 * i + 1] = (uint8_t)(h[i] >> 8);
        }
#endif
        out += 2 * k;
        src += k;
        n -= k;
    }
}

FERRY_HOT_LOOP void ferry_rpc_bf16_widen(float *dst, const void *src, size_t n) {
    const uint8_t *in = src;
    uint16_t h[BF16_BLOCK];
    uint32_t u[BF16_BLOCK];
    while (n > 0) {
        size_t k = n < BF16_BLOCK ? n : BF16_BLOCK;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(h, in, k * sizeof *h);
#else
        for (size_t i = 0; i < k; i++)
            h[i] = (uint16_t)(in[2 * i] | (uint16_t)in[2 * i + 1] << 8);
#endif
        for (size_t i = 0; i < k; i++)
            u[i] = (uint32_t)h[i] << 16;
        memcpy(dst, u, k * sizeof *u);
        in += 2 * k;
        dst += k;
        n -= k;
    }
}
