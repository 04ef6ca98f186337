/* checked.h - overflow-safe arithmetic for numbers that arrive from outside (a
 * request, a checkpoint file). Every offset, count or size taken from the wire goes
 * through one of these before it indexes memory or sizes an allocation; each
 * returns 1 when the result is exact and in range, 0 otherwise (never UB).
 *
 *     if (!ferry_checked_range(q->row_begin, q->row_count, first, end))
 *         return ferry_errorf(FERRY_ERR_RANGE, ...);
 *     size_t bytes;
 *     if (!ferry_checked_bytes(N, V, sizeof(float), &bytes)) ...   // N*V*4 */
#ifndef FERRY_CHECKED_H
#define FERRY_CHECKED_H

#include <stddef.h>
#include <stdint.h>

static inline int ferry_checked_mul(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* [begin, begin + count) lies inside [lo, hi): count >= 0, begin >= lo and
 * begin + count <= hi, decided without ever forming an overflowing sum. */
static inline int ferry_checked_range(int64_t begin, int64_t count, int64_t lo, int64_t hi) {
    int64_t end;
    return count >= 0 && begin >= lo && begin <= hi &&
           !__builtin_add_overflow(begin, count, &end) && end <= hi;
}

/* *out = a * b * elem bytes for non-negative a, b; 0 on a negative factor or an
 * overflow of size_t (or of int64, so the result can also be used as an int64). */
static inline int ferry_checked_bytes(int64_t a, int64_t b, size_t elem, size_t *out) {
    int64_t n, bytes;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &n) ||
        __builtin_mul_overflow(n, (int64_t)elem, &bytes))
        return 0;
    *out = (size_t)bytes;
    return 1;
}

#endif /* FERRY_CHECKED_H */
