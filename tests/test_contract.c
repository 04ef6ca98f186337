/* test_contract.c - the wire contract (common/rpc/contract.h) is well formed and
 * proto/ferry.proto, which states it in prose for clients in other languages, names
 * every part of it: each kind is a field of ModuleConfig's `kind` oneof, and each mode,
 * tensor, parameter and optimizer field appears in the .proto in quotes; no tensor
 * name the code no longer reads ("lse") is described there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/rpc/contract.h"
#include "ferry.pb-c.h"
#include "ferry/optim.h"

static char *proto_text(void) {
    FILE *f = fopen(FERRY_SOURCE_DIR "/proto/ferry.proto", "rb");
    CHECK(f != NULL);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    CHECK(n > 0 && n < sizeof buf - 1);
    buf[n] = '\0';
    (void)fclose(f);
    return buf;
}

/* `"name"` somewhere in the proto's text. */
static int quoted(const char *text, const char *name) {
    char q[96];
    (void)snprintf(q, sizeof q, "\"%s\"", name);
    return strstr(text, q) != NULL;
}

static void expect_quoted(const char *text, const char *what, const char *name) {
    if (!quoted(text, name)) {
        fprintf(stderr, "proto/ferry.proto does not name %s \"%s\"\n", what, name);
        CHECK(!"the .proto states the whole contract");
    }
}

TEST(contract_is_well_formed) {
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT; k++) {
        CHECK(ferry_wire_kind_find(ferry_wire_kinds[k].name) == k);
        int defaults = 0, modes = 0;
        for (int m = 0; m < FERRY_WIRE_MODE_COUNT; m++) {
            if (ferry_wire_modes[m].kind != (ferry_wire_kind)k)
                continue;
            modes++;
            defaults += ferry_wire_modes[m].is_default;
            ferry_wire_mode got;
            CHECK_OK(ferry_wire_mode_find((ferry_wire_kind)k, ferry_wire_modes[m].name, &got));
            CHECK_EQ((int)got, m);
            /* Every mode gives an output and takes a gradient; every Forward but the dense
             * pull (which reads the module alone) takes an input. */
            int seen[4] = {0};
            for (int t = 0; t < FERRY_WIRE_TENSOR_COUNT; t++)
                if (ferry_wire_tensors[t].mode == (ferry_wire_mode)m)
                    seen[ferry_wire_tensors[t].dir]++;
            CHECK(seen[FERRY_WIRE_FWD_IN] > 0 || k == FERRY_WIRE_KIND_DENSE);
            CHECK(seen[FERRY_WIRE_FWD_OUT] > 0);
            CHECK(seen[FERRY_WIRE_BWD_IN] > 0);
        }
        CHECK(modes >= 1);
        CHECK_EQ(defaults, 1); /* "" selects exactly one mode */
        ferry_wire_mode got;
        CHECK_OK(ferry_wire_mode_find((ferry_wire_kind)k, "", &got));
        CHECK_STATUS(ferry_wire_mode_find((ferry_wire_kind)k, "bogus", &got),
                     FERRY_ERR_UNSUPPORTED);
    }
    /* Within one call, names are unique. */
    for (int a = 0; a < FERRY_WIRE_TENSOR_COUNT; a++)
        for (int b = a + 1; b < FERRY_WIRE_TENSOR_COUNT; b++) {
            const ferry_wire_tensor *x = &ferry_wire_tensors[a], *y = &ferry_wire_tensors[b];
            CHECK(!(x->mode == y->mode && x->dir == y->dir && strcmp(x->name, y->name) == 0));
        }
    CHECK(ferry_wire_kind_find("rmsprop") < 0);
}

TEST(proto_states_the_contract) {
    const char *text = proto_text();
    const char *oneof = strstr(text, "  oneof kind {");
    CHECK(oneof != NULL);
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT; k++) {
        char field[64]; /* "Config embedding = " inside the oneof */
        (void)snprintf(field, sizeof field, "Config %s = ", ferry_wire_kinds[k].name);
        const char *at = strstr(oneof, field), *end = strstr(oneof, "  }");
        if (at == NULL || end == NULL || at > end) {
            fprintf(stderr, "proto/ferry.proto: ModuleConfig's oneof lacks kind %s\n",
                    ferry_wire_kinds[k].name);
            CHECK(!"the .proto states the whole contract");
        }
    }
    for (int m = 0; m < FERRY_WIRE_MODE_COUNT; m++)
        expect_quoted(text, "mode", ferry_wire_modes[m].name);
    for (int t = 0; t < FERRY_WIRE_TENSOR_COUNT; t++)
        expect_quoted(text, "tensor", ferry_wire_tensors[t].name);
    for (int p = 0; p < FERRY_WIRE_PARAM_COUNT; p++)
        expect_quoted(text, "parameter", ferry_wire_params[p].name);
    /* The optimizer's fields are `extra` names on the wire. */
    for (int i = 0; i < FERRY_OPTIM_FIELD_COUNT; i++)
        expect_quoted(text, "optimizer field", ferry_optim_fields[i].name);
    /* The decoder's Backward takes "factor"; "lse" was an older name. */
    CHECK(!quoted(text, "lse"));
}

/* Every kind's config goes through the descriptors and back, packed and unpacked as
 * on the wire: its sizes, and exactly the fields its message has (linear: no_bias and
 * stiefel; lstm: layers, first_layer, dropout_ppm and stiefel; the rest none). */
TEST(kind_config_round_trips) {
    for (int k = 0; k < FERRY_WIRE_KIND_COUNT; k++) {
        ferry_wire_kind_config in = {.kind = (ferry_wire_kind)k,
                                     .dims = {1000 + k, 2000000000 + k},
                                     .no_bias = 1,
                                     .layers = 3,
                                     .first_layer = 2,
                                     .dropout_ppm = 250000,
                                     .stiefel = 1,
                                     .beta = 0.125,
                                     .polar = 1};
        Ferry__V1__ModuleConfig mc;
        ferry__v1__module_config__init(&mc);
        CHECK_OK(ferry__wire_kind_config_write(&in, &mc.base));
        uint8_t buf[256];
        size_t n = ferry__v1__module_config__pack(&mc, buf);
        ferry__wire_kind_config_clear(&mc.base);
        CHECK(mc.kind_case == FERRY__V1__MODULE_CONFIG__KIND__NOT_SET);
        Ferry__V1__ModuleConfig *back = ferry__v1__module_config__unpack(NULL, n, buf);
        CHECK(back != NULL);
        ferry_wire_kind_config out;
        CHECK_OK(ferry__wire_kind_config_read(&back->base, &out));
        ferry__v1__module_config__free_unpacked(back, NULL);
        unsigned has = ferry__wire_kind_config_fields((ferry_wire_kind)k);
        CHECK(out.kind == in.kind && out.has == has);
        CHECK(out.dims[0] == in.dims[0] && out.dims[1] == in.dims[1]);
        CHECK(out.no_bias == ((has & FERRY_WIRE_CFG_NO_BIAS) ? 1 : 0));
        CHECK(out.layers == ((has & FERRY_WIRE_CFG_LAYERS) ? 3u : 0u));
        CHECK(out.first_layer == ((has & FERRY_WIRE_CFG_FIRST_LAYER) ? 2u : 0u));
        CHECK(out.dropout_ppm == ((has & FERRY_WIRE_CFG_DROPOUT_PPM) ? 250000u : 0u));
        int st = (has & FERRY_WIRE_CFG_STIEFEL) != 0;
        CHECK(out.stiefel == st && out.beta == (st ? 0.125 : 0.0) && out.polar == st);
        /* A kind may carry a Stiefel constraint exactly when its row says so. */
        CHECK(st == ferry_wire_kinds[k].stiefel);
    }
    CHECK(ferry__wire_kind_config_fields(FERRY_WIRE_KIND_LSTM) ==
          (FERRY_WIRE_CFG_LAYERS | FERRY_WIRE_CFG_FIRST_LAYER | FERRY_WIRE_CFG_DROPOUT_PPM |
           FERRY_WIRE_CFG_STIEFEL));
    CHECK(ferry__wire_kind_config_fields(FERRY_WIRE_KIND_EMBEDDING) == 0);
    /* A config that names no kind is refused, naming the kinds. */
    Ferry__V1__ModuleConfig none;
    ferry__v1__module_config__init(&none);
    ferry_wire_kind_config out;
    CHECK_STATUS(ferry__wire_kind_config_read(&none.base, &out), FERRY_ERR_INVALID);
    CHECK(strstr(ferry_error_last(), "embedding | decoder | linear | dense | lstm") != NULL);
}

FERRY_TEST_MAIN(T(contract_is_well_formed) T(proto_states_the_contract) T(kind_config_round_trips))
