/* A Dispatch as the worker holds one (wk_dispatch_msg.h). */
#include "tests/unit/wk_dispatch_msg.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "proto/baton.pb-c.h"

wk_dispatch *tu_dispatch_new(wk_store *store, uint64_t key, const char *rid, uint32_t iter,
                             uint32_t upto, uint64_t dispatch_id)
{
    uint32_t iv[1] = {iter};
    Baton__V1__Dispatch d = BATON__V1__DISPATCH__INIT;
    d.request_key = key;
    d.request_id = (char *)rid;
    d.node_name = "step";
    d.model = "m";
    d.mode = "decode";
    d.n_iteration = 1;
    d.iteration = iv;
    d.speculate_upto = upto;
    d.dispatch_id = dispatch_id;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH;
    m.dispatch = &d;
    size_t n = baton__v1__conductor_message__get_packed_size(&m);
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    baton__v1__conductor_message__pack(&m, buf);
    Baton__V1__ConductorMessage *msg = baton__v1__conductor_message__unpack(NULL, n, buf);
    assert_non_null(msg);
    free(buf);
    wk_dispatch *disp = wk_item_dispatch_new(msg, store);
    assert_non_null(disp);
    return disp;
}
