/* json.h - a small JSON DOM reader for tests (reference vectors in tests/data/).
 * Parses a whole document into a read-only tree; numbers become double. The accessors
 * are NULL-tolerant so a chain like ferry_json_num(ferry_json_path(root, "a.0.b")) never
 * crashes on a missing field: it yields NAN instead. Not thread-safe per tree while
 * it is being destroyed; concurrent reads of a parsed tree are fine.
 *
 *     ferry_json *root;
 *     CHECK_OK(ferry_json_parse_file(ferry_test_path("tests/data/torch_nn.json"), &root));
 *     long dims[4]; int ndim; double *w;
 *     long n = ferry_json_tensor(ferry_json_path(root, "linear.params.weight"), &w, &ndim, dims);
 *     ...
 *     free(w);
 *     ferry_json_destroy(root);
 */
#ifndef FERRY_TEST_JSON_H
#define FERRY_TEST_JSON_H

#include <stddef.h>

#include "ferry/status.h"

typedef struct ferry_json ferry_json; /* opaque node */

typedef enum ferry_json_type {
    FERRY_JSON_NONE = 0, /* what ferry_json_type(NULL) reports */
    FERRY_JSON_NULL,
    FERRY_JSON_BOOL,
    FERRY_JSON_NUMBER,
    FERRY_JSON_STRING,
    FERRY_JSON_ARRAY,
    FERRY_JSON_OBJECT,
} ferry_json_type;

/* Nesting deeper than this is rejected with FERRY_ERR_FORMAT (the parser recurses). */
#define FERRY_JSON_MAX_DEPTH 256

/* Parses len bytes of text (no NUL terminator needed) into a tree stored in *out; the
 * caller releases it with ferry_json_destroy(). Accepts RFC 8259 JSON plus, as Python's
 * json module writes them, the literals NaN, Infinity and -Infinity, and a leading UTF-8
 * byte-order mark. Returns FERRY_ERR_FORMAT for malformed text (the detail message gives
 * line, column and what was expected), FERRY_ERR_INVALID for NULL arguments and
 * FERRY_ERR_NOMEM when memory runs out; *out is unchanged on failure. Strings containing
 * \u0000 are rejected (the accessors hand out C strings). Duplicate object keys are kept;
 * lookups find the last one, as Python's json does. */
ferry_status ferry_json_parse(const char *text, size_t len, ferry_json **out);

/* Reads the file at path and parses it as ferry_json_parse() does. Returns FERRY_ERR_IO
 * if the file cannot be opened or read, otherwise as ferry_json_parse(). */
ferry_status ferry_json_parse_file(const char *path, ferry_json **out);

/* Frees a tree returned by the parse functions. NULL is a no-op. */
void ferry_json_destroy(ferry_json *root);

/* The node's type; FERRY_JSON_NONE for NULL. */
ferry_json_type ferry_json_type_of(const ferry_json *n);

/* The member named key of an object (the last one if repeated), or NULL if obj is
 * NULL, not an object, or has no such member. */
const ferry_json *ferry_json_get(const ferry_json *obj, const char *key);

/* Element i of an array, or value i of an object (in document order); NULL if out of
 * range or arr is neither. */
const ferry_json *ferry_json_at(const ferry_json *arr, size_t i);

/* Key i of an object (in document order), or NULL if out of range or not an object. */
const char *ferry_json_key(const ferry_json *obj, size_t i);

/* Number of elements of an array or members of an object; 0 for anything else. */
size_t ferry_json_len(const ferry_json *arr_or_obj);

/* The value of a number node; NAN if n is NULL or not a number. */
double ferry_json_num(const ferry_json *n);

/* 1 for true, 0 for false, -1 if n is NULL or not a boolean. */
int ferry_json_bool(const ferry_json *n);

/* The NUL-terminated UTF-8 text of a string node (owned by the tree), or NULL if s is
 * NULL or not a string. */
const char *ferry_json_str(const ferry_json *s);

/* Follows a dotted path from root: "lstm.0.params.weight_ih_l0". On an object a
 * component is a key (even if it is all digits); on an array it must be a decimal
 * index. "" returns root. NULL if any step is missing, or on an empty component. */
const ferry_json *ferry_json_path(const ferry_json *root, const char *dotted);

/* Decodes a tensor node {"shape": [d0, ...], "data": [...]} (row-major, at most 4 dims)
 * or a plain number (a 0-d tensor of one element). Returns the element count, and
 * stores a malloc'd copy of the data in *data (the caller frees it), the rank in *ndim
 * and the dimensions in dims[0..ndim-1]. Any of data, ndim, dims may be NULL to skip
 * that output. Returns -1, with a detail in ferry_error_last() and the outputs
 * unchanged, if t is NULL, malformed (shape not a list of non-negative integers,
 * prod(shape) != len(data), a non-number in data, more than 4 dims) or memory runs
 * out. */
long ferry_json_tensor(const ferry_json *t, double **data, int *ndim, long dims[4]);

/* As ferry_json_tensor() but returns a malloc'd float copy of the data and stores the
 * element count in *n (n may be NULL); NULL on failure (*n unchanged). */
float *ferry_json_tensor_f32(const ferry_json *t, long *n);

#endif /* FERRY_TEST_JSON_H */
