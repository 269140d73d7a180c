/* The catalog of built-in backends (backends/catalog.c): every option
 * states what it allows and its default obeys it, and bt_opt_parse /
 * bt_opt_check read and refuse values with a message that says what is
 * allowed.  The config loader and the backends both go through these, so
 * what is tested here is what `batond --check-config` and a worker's load
 * refuse alike.  And config/README.md's table of backend options says
 * what the catalog declares. */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backends/catalog.h"
#include "common/status.h"

/* Every declared option is consistent: a range for a number, a default
 * that reads as its type and lies inside what is allowed, a required
 * option without a default. */
static void test_declarations_consistent(void **state)
{
    (void)state;
    size_t n;
    const bt_backend_desc *const *all = bt_backend_all(&n);
    assert_true(n >= 7);
    for (size_t i = 0; i < n; i++) {
        const bt_backend_desc *b = all[i];
        assert_ptr_equal(bt_backend_find(b->name), b);
        for (size_t k = 0; k < b->n_options; k++) {
            const bt_opt_desc *d = &b->options[k];
            assert_ptr_equal(bt_backend_option(b, d->name), d);
            assert_non_null(d->doc);
            if (d->type == BT_OPT_INT)
                assert_true(d->min < d->max);
            if (d->type == BT_OPT_FLOAT)
                assert_true(d->fmin < d->fmax);
            if (d->allowed) {
                assert_int_equal(d->type, BT_OPT_STRING);
                assert_non_null(d->allowed[0]);
            }
            assert_false(d->required && d->def);
            bt_opt_value v;
            char err[256] = "";
            if (bt_opt_parse(b, d, NULL, &v, err, sizeof(err)) != 0)
                fail_msg("default of %s.%s: %s", b->name, d->name, err);
            assert_int_equal(v.set, d->def != NULL);
        }
    }
}

/* The transformer's enumerated options and ranges, read as a backend reads
 * them (text) and refused with what is allowed. */
static void test_parse_and_refuse(void **state)
{
    (void)state;
    const bt_backend_desc *b = bt_backend_find("transformer");
    assert_non_null(b);
    bt_opt_value v;
    char err[256];

    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "kv_dtype"), NULL, &v, err,
                                  sizeof(err)), 0);
    assert_true(v.set);
    assert_string_equal(v.s, "auto");
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "kv_dtype"), "q8_0", &v, err,
                                  sizeof(err)), 0);
    assert_string_equal(v.s, "q8_0");
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "kv_dtype"), "q4", &v, err,
                                  sizeof(err)), BT_EINVAL);
    assert_string_equal(err, "option kv_dtype = 'q4': use auto, f16, q8_0 or f32 "
                             "(backend 'transformer')");
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "activations"), "f16", &v, err,
                                  sizeof(err)), BT_EINVAL);
    assert_string_equal(err, "option activations = 'f16': use q8 or f32 (backend 'transformer')");

    const bt_opt_desc *seq = bt_backend_option(b, "max_seq");
    assert_int_equal(bt_opt_parse(b, seq, NULL, &v, err, sizeof(err)), 0);
    assert_int_equal(v.i, 2048);
    assert_int_equal(bt_opt_parse(b, seq, "96", &v, err, sizeof(err)), 0);
    assert_int_equal(v.i, 96);
    assert_int_equal(bt_opt_parse(b, seq, "1", &v, err, sizeof(err)), BT_ERANGE);
    assert_string_equal(err, "option max_seq = '1': want an integer in [2, 1048576] "
                             "(backend 'transformer')");
    assert_int_equal(bt_opt_parse(b, seq, "1048577", &v, err, sizeof(err)), BT_ERANGE);
    assert_int_equal(bt_opt_parse(b, seq, "lots", &v, err, sizeof(err)), BT_EINVAL);
    assert_non_null(strstr(err, "max_seq = 'lots'"));
    assert_int_equal(bt_opt_parse(b, seq, "", &v, err, sizeof(err)), BT_EINVAL);
    assert_int_equal(bt_opt_parse(b, seq, "99999999999999999999", &v, err, sizeof(err)),
                     BT_ERANGE);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "eos"), "-1", &v, err, sizeof(err)),
                     0);
    assert_int_equal(v.i, -1);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "eos"), "-2", &v, err, sizeof(err)),
                     BT_ERANGE);

    const bt_opt_desc *chat = bt_backend_option(b, "chat_template");
    assert_int_equal(bt_opt_parse(b, chat, NULL, &v, err, sizeof(err)), 0);
    assert_true(v.b);
    assert_int_equal(bt_opt_parse(b, chat, "false", &v, err, sizeof(err)), 0);
    assert_false(v.b);
    assert_int_equal(bt_opt_parse(b, chat, "yes", &v, err, sizeof(err)), BT_EINVAL);
    assert_string_equal(err, "option chat_template = 'yes': want true or false "
                             "(backend 'transformer')");

    /* A required option without a default is unset when not given; the
     * backend says it is missing. */
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "path"), NULL, &v, err, sizeof(err)),
                     0);
    assert_false(v.set);
}

/* The test backends' counts have no upper limit but may not be negative;
 * an option with no default stays unset. */
static void test_counts(void **state)
{
    (void)state;
    const bt_backend_desc *b = bt_backend_find("chunks");
    bt_opt_value v;
    char err[256];
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "n"), NULL, &v, err, sizeof(err)), 0);
    assert_int_equal(v.i, 3);
    assert_int_equal(bt_opt_parse(b, bt_backend_option(b, "n"), "-1", &v, err, sizeof(err)),
                     BT_ERANGE);
    assert_string_equal(err, "option n = '-1': want an integer >= 0 (backend 'chunks')");
    const bt_backend_desc *c = bt_backend_find("counter");
    assert_int_equal(bt_opt_parse(c, bt_backend_option(c, "finish_after"), NULL, &v, err,
                                  sizeof(err)), 0);
    assert_false(v.set);
    /* bt_opt_check takes a value already read (the config loader's YAML). */
    bt_opt_value neg = {.set = true, .i = -5};
    assert_int_equal(bt_opt_check(c, bt_backend_option(c, "finish_after"), &neg, "-5", NULL, 0),
                     BT_ERANGE);
    bt_opt_value unset = {0};
    assert_int_equal(bt_opt_check(c, bt_backend_option(c, "finish_after"), &unset, NULL, NULL,
                                  0), 0);
}

/* ---- config/README.md states the same ---- */

/* CELL without the spaces around it, into OUT. */
static void trim_cell(const char *cell, size_t len, char *out, size_t cap)
{
    while (len && *cell == ' ')
        cell++, len--;
    while (len && cell[len - 1] == ' ')
        len--;
    snprintf(out, cap, "%.*s", (int)len, cell);
}

/* The type column the README should give D: "integer 2–1048576",
 * "`auto`, `f16`, `q8_0` or `f32`", "boolean". */
static void readme_type(const bt_opt_desc *d, char *out, size_t cap)
{
    size_t at = 0, n = 0;
    switch (d->type) {
    case BT_OPT_INT:
        if (d->max == INT64_MAX)
            snprintf(out, cap, "integer ≥ %" PRId64, d->min);
        else
            snprintf(out, cap, "integer %" PRId64 "–%" PRId64, d->min, d->max);
        return;
    case BT_OPT_FLOAT: snprintf(out, cap, "number %g–%g", d->fmin, d->fmax); return;
    case BT_OPT_BOOL: snprintf(out, cap, "boolean"); return;
    case BT_OPT_PATH: snprintf(out, cap, "path"); return;
    case BT_OPT_STRING:
        if (!d->allowed) {
            snprintf(out, cap, "string");
            return;
        }
        while (d->allowed[n])
            n++;
        out[0] = 0;
        for (size_t k = 0; k < n && at < cap; k++)
            at += (size_t)snprintf(out + at, cap - at, "%s`%s`",
                                   k == 0 ? "" : k + 1 < n ? ", " : " or ", d->allowed[k]);
        return;
    }
}

/* The default column the README should give D. */
static void readme_default(const bt_opt_desc *d, char *out, size_t cap)
{
    if (d->required)
        snprintf(out, cap, "required");
    else if (!d->def)
        snprintf(out, cap, "unset");
    else if (d->type == BT_OPT_INT || d->type == BT_OPT_FLOAT)
        snprintf(out, cap, "%s", d->def);
    else
        snprintf(out, cap, "`%s`", d->def);
}

/* The table "Built-in backends and their options" of config/README.md has
 * a row per declared option, in the catalog's order, and its type and
 * default columns say what the catalog declares. */
static void test_readme_agrees(void **state)
{
    (void)state;
    FILE *f = fopen("config/README.md", "r");
    assert_non_null(f);
    char line[4096], backend[64] = "";
    bool in_table = false;
    size_t n_backends;
    const bt_backend_desc *const *all = bt_backend_all(&n_backends);
    size_t next_backend = 0, next_option = 0, rows = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "### Built-in backends and their options", 39) == 0) {
            in_table = true;
            continue;
        }
        if (!in_table)
            continue;
        if (line[0] != '|') {
            if (rows)
                break; /* the end of the table */
            continue;
        }
        char cells[6][512];
        const char *p = line + 1;
        int nc = 0;
        for (const char *bar; nc < 6 && (bar = strchr(p, '|')); p = bar + 1)
            trim_cell(p, (size_t)(bar - p), cells[nc++], sizeof(cells[0]));
        assert_true(nc >= 5);
        if (strcmp(cells[0], "backend") == 0 || strncmp(cells[0], "---", 3) == 0)
            continue; /* the header */
        rows++;
        if (cells[0][0]) { /* a new backend: the last one's options are all listed */
            if (next_backend > 0)
                assert_int_equal(next_option, all[next_backend - 1]->n_options);
            assert_true(next_backend < n_backends);
            snprintf(backend, sizeof(backend), "`%s`", all[next_backend]->name);
            assert_string_equal(cells[0], backend);
            next_backend++;
            next_option = 0;
            if (!cells[1][0]) { /* a backend without options */
                assert_int_equal(all[next_backend - 1]->n_options, 0);
                continue;
            }
        }
        const bt_backend_desc *b = all[next_backend - 1];
        assert_true(next_option < b->n_options);
        const bt_opt_desc *d = &b->options[next_option++];
        char want[512];
        snprintf(want, sizeof(want), "`%s`", d->name);
        assert_string_equal(cells[1], want);
        readme_type(d, want, sizeof(want));
        if (strcmp(cells[2], want) != 0)
            fail_msg("config/README.md gives %s.%s the type '%s'; the catalog says '%s'",
                     b->name, d->name, cells[2], want);
        readme_default(d, want, sizeof(want));
        if (strcmp(cells[3], want) != 0)
            fail_msg("config/README.md gives %s.%s the default '%s'; the catalog says '%s'",
                     b->name, d->name, cells[3], want);
    }
    fclose(f);
    assert_int_equal(next_backend, n_backends);
    assert_int_equal(next_option, all[n_backends - 1]->n_options);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declarations_consistent),
        cmocka_unit_test(test_parse_and_refuse),
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_readme_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
