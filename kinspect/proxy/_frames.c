/* A frame read straight from the socket into the bytes object it becomes.
 *
 * The proxy reads a large frame's body with asyncio's BufferedProtocol: the event
 * loop asks for a buffer, reads into it, and says how much it read. A FrameBuffer
 * is that buffer for one frame: it allocates the frame's bytes object up front
 * (PyBytes_FromStringAndSize(NULL, size): allocated, not written, as os.read and
 * socket.recv do before they read into one) and exports its storage as a writable
 * buffer. When the last byte has been read, `frame` is an ordinary bytes object,
 * and nothing was copied in user space on the way.
 *
 * The contract that keeps this sound (kinspect.proxy.server.CutThrough keeps it):
 *   - nothing reads `frame` before every byte of it has been read into it;
 *   - a byte is written once, by the read that fills it, and only read after that
 *     (the forwarding writes of the bytes just read, which the event loop may
 *     keep queued, are given read-only views);
 *   - the writable views are dropped when the frame is complete.
 * Reading `frame` seals the buffer: from then on it is only exported read-only.
 * The bytes object's hash is not cached before then (nothing hashes it earlier).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#define FRAMES_ABI 3

typedef struct {
    PyObject_HEAD
    PyObject *frame;  /* bytes, being filled */
    int sealed;       /* `frame` was read: no more writable exports */
} FrameBuffer;

static PyObject *
FrameBuffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"size", NULL};
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:FrameBuffer", kwlist, &size))
        return NULL;
    /* bytes of length 0 and 1 may be shared singletons: never write into those */
    if (size < 2) {
        PyErr_Format(PyExc_ValueError, "a frame buffer holds at least 2 bytes, not %zd", size);
        return NULL;
    }
    FrameBuffer *self = (FrameBuffer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->frame = PyBytes_FromStringAndSize(NULL, size);
    if (self->frame == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
FrameBuffer_dealloc(FrameBuffer *self)
{
    Py_XDECREF(self->frame);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
FrameBuffer_getbuffer(FrameBuffer *self, Py_buffer *view, int flags)
{
    if (self->sealed && (flags & PyBUF_WRITABLE)) {
        PyErr_SetString(PyExc_BufferError, "the frame is complete: its buffer is read-only");
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->frame),
                             PyBytes_GET_SIZE(self->frame), self->sealed, flags);
}

static PyBufferProcs FrameBuffer_as_buffer = {
    .bf_getbuffer = (getbufferproc)FrameBuffer_getbuffer,
};

static PyObject *
FrameBuffer_get_frame(FrameBuffer *self, void *closure)
{
    self->sealed = 1;
    Py_INCREF(self->frame);
    return self->frame;
}

static PyObject *
FrameBuffer_get_size(FrameBuffer *self, void *closure)
{
    return PyLong_FromSsize_t(PyBytes_GET_SIZE(self->frame));
}

static PyGetSetDef FrameBuffer_getset[] = {
    {"frame", (getter)FrameBuffer_get_frame, NULL,
     "The bytes object being filled; read it only once every byte has been written "
     "(reading it seals the buffer: only read-only exports from then on).",
     NULL},
    {"size", (getter)FrameBuffer_get_size, NULL, "Its length in bytes.", NULL},
    {NULL}
};

static PyTypeObject FrameBuffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._frames.FrameBuffer",
    .tp_basicsize = sizeof(FrameBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FrameBuffer(size): a new bytes object of `size` bytes, written through "
              "this object's (writable) buffer, read as `frame` once full.",
    .tp_new = FrameBuffer_new,
    .tp_dealloc = (destructor)FrameBuffer_dealloc,
    .tp_as_buffer = &FrameBuffer_as_buffer,
    .tp_getset = FrameBuffer_getset,
};

/* ---------------------------------------------------------------------------
 * The hops' short path (kinspect.proxy.server: _ClientSide, _UpstreamSide).
 *
 * A Hop is the protocol object of one side of a proxied connection, and its
 * data_received is the common case of a read, in C: the read is one whole frame,
 * forwarded as read, then noted for pairing (Connection.unsettled), with the
 * request's correlation id noted for its answer's check (Connection.apis). What
 * it touches is held here by reference (the connection's containers, the proxy's
 * counters, the other side's write), so that a read reaches no Python object
 * through attributes: measured in BENCHMARKS.md (Proxy, twenty-seventh session),
 * that, and no Python frame between the event loop and the write, is what a
 * round trip through the proxy costs over a plain forwarder.
 *
 * Everything else goes to the side's Python `_slow(data)`, which does what the
 * Python short path and the long path do: any read while `fast` is off (Python
 * keeps it on only while the conditions of the short path hold, see
 * Connection._refresh_fast), a read that is not one whole frame, a SaslHandshake
 * request, a request whose (api key, version) has no answer check noted yet
 * (Proxy.response_check) or whose correlation id is still waiting for an answer,
 * an answer whose request was paired already, which is held for rewriting (no
 * scan for its api version) or whose tags do not scan clear. Each of these is
 * decided before anything is written, so the Python path sees the read exactly as
 * it came.
 * ------------------------------------------------------------------------- */

#define SASL_HANDSHAKE 17
#define KICK_EVERY 32          /* requests a hop forwards between two kicks at most */

/* The proxy's running counts that every read moves, in one object: the bytes
 * read from each side (Stats) and the frames and bytes of the short path not
 * paired yet (Proxy.unsettled_frames, unsettled_bytes). */
typedef struct {
    PyObject_HEAD
    long long bytes_from_clients;
    long long bytes_from_brokers;
    long long unsettled_frames;
    long long unsettled_bytes;
} Counters;

static PyMemberDef Counters_members[] = {
    {"bytes_from_clients", T_LONGLONG, offsetof(Counters, bytes_from_clients), 0,
     "Bytes read from clients."},
    {"bytes_from_brokers", T_LONGLONG, offsetof(Counters, bytes_from_brokers), 0,
     "Bytes read from brokers."},
    {"unsettled_frames", T_LONGLONG, offsetof(Counters, unsettled_frames), 0,
     "Frames forwarded on the short path and not paired yet."},
    {"unsettled_bytes", T_LONGLONG, offsetof(Counters, unsettled_bytes), 0,
     "Their bytes."},
    {NULL}
};

static PyTypeObject Counters_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._frames.Counters",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counters(): a proxy's byte and frame counts (all 0), read and written "
              "by the hops and by Python alike.",
    .tp_new = PyType_GenericNew,
    .tp_members = Counters_members,
};

typedef struct {
    PyObject_HEAD
    char fast;            /* the short path's conditions hold (set by Python) */
    char answers;         /* the broker's side (else the client's) */
    Py_ssize_t max_frame;
    Py_ssize_t max_inflight; /* kinspect.proxy.server.MAX_INFLIGHT */
    long long consumed;   /* bytes forwarded here (counted in the side's CutThrough) */
    long long kick_frames, kick_bytes; /* a full batch (Pipeline.batch_events, BATCH_KICK) */
    int since_kick;       /* requests forwarded here since the pipeline's kick was asked */
    PyObject *peer_write, *peer_closing;          /* the other side's transport */
    PyObject *unsettled, *apis, *pending, *checks, *arrivals;
    PyObject *unsettle, *kick, *inflight, *inflight_check;
    PyObject *scan, *scanned;
    Counters *counters;
    int last_key, last_version;
    PyObject *last_check; /* the answer check of (last_key, last_version) */
} Hop;

static PyObject *str_slow;

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int
be16(const unsigned char *p)
{
    return (int16_t)(((unsigned)p[0] << 8) | p[1]);
}

/* (each callable held for the call: whatever it runs may set another in its place) */
static int
call_none(PyObject *f)
{
    Py_INCREF(f);
    PyObject *r = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
call_one(PyObject *f, PyObject *arg)
{
    Py_INCREF(f);
    PyObject *r = PyObject_CallOneArg(f, arg);
    Py_DECREF(f);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Note a forwarded frame for pairing: (data, time.time_ns(), next(arrivals)) and,
 * for an answer, its check's outcome; the connection registered with the proxy
 * when it is the first waiting. */
static int
note(Hop *h, PyObject *data, Py_ssize_t n, PyObject *outcome)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);  /* what time.time_ns() reads */
    PyObject *ns = PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    if (ns == NULL)
        return -1;
    PyObject *arrival = PyIter_Next(h->arrivals);
    if (arrival == NULL) {
        Py_DECREF(ns);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the arrival count ended");
        return -1;
    }
    PyObject *ev = outcome == NULL ? PyTuple_Pack(3, data, ns, arrival)
                                   : PyTuple_Pack(4, data, ns, arrival, outcome);
    Py_DECREF(ns);
    Py_DECREF(arrival);
    if (ev == NULL)
        return -1;
    if (PyList_GET_SIZE(h->unsettled) == 0 && call_none(h->unsettle) < 0) {
        Py_DECREF(ev);
        return -1;
    }
    int r = PyList_Append(h->unsettled, ev);
    Py_DECREF(ev);
    if (r < 0)
        return -1;
    h->counters->unsettled_frames += 1;
    h->counters->unsettled_bytes += n;
    return 0;
}

/* The answer check noted for a request of (key, version), borrowed; NULL when
 * there is none yet (no error set) or on error. */
static PyObject *
check_of(Hop *h, int key, int version)
{
    if (h->last_check != NULL && key == h->last_key && version == h->last_version)
        return h->last_check;
    PyObject *k = Py_BuildValue("(ii)", key, version);
    if (k == NULL)
        return NULL;
    PyObject *chk = PyDict_GetItemWithError(h->checks, k);
    Py_DECREF(k);
    if (chk == NULL)
        return NULL;
    Py_INCREF(chk);
    Py_XSETREF(h->last_check, chk);
    h->last_key = key;
    h->last_version = version;
    return chk;
}

static PyObject *
request(Hop *h, PyObject *data, const unsigned char *p, Py_ssize_t n)
{
    if (n < 12)
        goto slow;
    int64_t size = (int32_t)be32(p);
    if (size + 4 != n || size > h->max_frame)
        goto slow;
    int key = be16(p + 4), version = be16(p + 6);
    if (key == SASL_HANDSHAKE)
        goto slow;
    PyObject *chk = check_of(h, key, version);
    if (chk == NULL) {
        if (PyErr_Occurred())
            return NULL;
        goto slow;
    }
    Py_INCREF(chk);  /* (held from here: the lookups and the write may run any code) */
    PyObject *corr = PyLong_FromLong((int32_t)be32(p + 8));
    if (corr == NULL) {
        Py_DECREF(chk);
        return NULL;
    }
    int taken = PyDict_Contains(h->apis, corr);
    if (taken == 0 && PyDict_GET_SIZE(h->pending))
        taken = PyDict_Contains(h->pending, corr);
    if (taken) {
        Py_DECREF(chk);
        Py_DECREF(corr);
        if (taken < 0)
            return NULL;
        goto slow;  /* an id still waiting for its answer */
    }
    if (call_one(h->peer_write, data) < 0)
        goto fail;
    h->consumed += n;
    h->counters->bytes_from_clients += n;
    if (note(h, data, n, NULL) < 0 || PyDict_SetItem(h->apis, corr, chk) < 0)
        goto fail;
    Py_DECREF(chk);
    Py_DECREF(corr);
    /* the pipeline starts a batch early when a full one waits (Pipeline.kick): asked
     * when the short path's frames alone make one, and after every KICK_EVERY
     * requests forwarded here (for the events its own queue holds) */
    if (++h->since_kick >= KICK_EVERY || h->counters->unsettled_frames >= h->kick_frames ||
            h->counters->unsettled_bytes >= h->kick_bytes) {
        h->since_kick = 0;
        if (call_none(h->kick) < 0)
            return NULL;
    }
    Py_ssize_t waiting = PyObject_Size(h->inflight);
    if (waiting < 0)
        return NULL;
    if (PyList_GET_SIZE(h->unsettled) + waiting >= h->max_inflight &&
            call_none(h->inflight_check) < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_DECREF(chk);
    Py_DECREF(corr);
    return NULL;
slow:
    return PyObject_CallMethodOneArg((PyObject *)h, str_slow, data);
}

static PyObject *
answer(Hop *h, PyObject *data, const unsigned char *p, Py_ssize_t n)
{
    if (n < 8)
        goto slow;
    int64_t size = (int32_t)be32(p);
    if (size + 4 != n || size > h->max_frame || PyDict_GET_SIZE(h->apis) == 0)
        goto slow;
    PyObject *corr = PyLong_FromLong((int32_t)be32(p + 4));
    if (corr == NULL)
        return NULL;
    PyObject *api = PyDict_GetItemWithError(h->apis, corr);
    if (api == NULL) {
        Py_DECREF(corr);
        if (PyErr_Occurred())
            return NULL;
        goto slow;  /* its request was paired already */
    }
    PyObject *outcome = Py_None;  /* (held from here: calls follow) */
    Py_INCREF(outcome);
    if (api != Py_None) {
        /* (api key, api version, scan): forwarded as read when the scan says none of
         * the tags that may carry broker addresses is there (Proxy.response_check) */
        PyObject *scan = PyTuple_Check(api) && PyTuple_GET_SIZE(api) == 3
                         ? PyTuple_GET_ITEM(api, 2) : Py_None;
        if (scan == Py_None || !PyTuple_Check(scan) || PyTuple_GET_SIZE(scan) != 3) {
            Py_DECREF(corr);
            Py_DECREF(outcome);
            goto slow;
        }
        Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(scan, 1));
        if (pos == -1 && PyErr_Occurred()) {
            Py_DECREF(corr);
            Py_DECREF(outcome);
            return NULL;
        }
        if (!(n > pos && (pos == 8 || p[8] == 0))) {
            Py_DECREF(corr);
            Py_DECREF(outcome);
            goto slow;
        }
        PyObject *end = PyLong_FromSsize_t(n);
        if (end == NULL) {
            Py_DECREF(corr);
            Py_DECREF(outcome);
            return NULL;
        }
        PyObject *scan_clear = h->scan;
        Py_INCREF(scan);
        Py_INCREF(scan_clear);
        PyObject *args[5] = {PyTuple_GET_ITEM(scan, 0), data, PyTuple_GET_ITEM(scan, 1), end,
                             PyTuple_GET_ITEM(scan, 2)};
        PyObject *clear = PyObject_Vectorcall(scan_clear, args, 5, NULL);
        Py_DECREF(scan_clear);
        Py_DECREF(scan);
        Py_DECREF(end);
        if (clear == NULL) {
            Py_DECREF(corr);
            Py_DECREF(outcome);
            return NULL;
        }
        int is_clear = clear == Py_True;
        Py_DECREF(clear);
        if (!is_clear) {
            Py_DECREF(corr);
            Py_DECREF(outcome);
            goto slow;
        }
        Py_INCREF(h->scanned);
        Py_SETREF(outcome, h->scanned);
    }
    int r = PyDict_DelItem(h->apis, corr);
    Py_DECREF(corr);
    if (r < 0)
        goto fail;
    PyObject *is_closing_f = h->peer_closing;
    Py_INCREF(is_closing_f);
    PyObject *closing = PyObject_CallNoArgs(is_closing_f);
    Py_DECREF(is_closing_f);
    if (closing == NULL)
        goto fail;
    int is_closing = PyObject_IsTrue(closing);
    Py_DECREF(closing);
    if (is_closing < 0 || (!is_closing && call_one(h->peer_write, data) < 0))
        goto fail;
    h->consumed += n;
    h->counters->bytes_from_brokers += n;
    if (note(h, data, n, outcome) < 0)
        goto fail;
    Py_DECREF(outcome);
    if (h->counters->unsettled_bytes >= h->kick_bytes && call_none(h->kick) < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_DECREF(outcome);
    return NULL;
slow:
    return PyObject_CallMethodOneArg((PyObject *)h, str_slow, data);
}

static PyObject *
Hop_data_received(Hop *h, PyObject *data)
{
    if (!h->fast || !PyBytes_CheckExact(data))
        return PyObject_CallMethodOneArg((PyObject *)h, str_slow, data);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    return h->answers ? answer(h, data, p, n) : request(h, data, p, n);
}

static int
Hop_traverse(Hop *h, visitproc visit, void *arg)
{
    Py_VISIT(h->peer_write);
    Py_VISIT(h->peer_closing);
    Py_VISIT(h->unsettled);
    Py_VISIT(h->apis);
    Py_VISIT(h->pending);
    Py_VISIT(h->checks);
    Py_VISIT(h->arrivals);
    Py_VISIT(h->unsettle);
    Py_VISIT(h->kick);
    Py_VISIT(h->inflight);
    Py_VISIT(h->inflight_check);
    Py_VISIT(h->scan);
    Py_VISIT(h->scanned);
    Py_VISIT(h->counters);
    Py_VISIT(h->last_check);
    return 0;
}

static int
Hop_clear(Hop *h)
{
    h->fast = 0;
    Py_CLEAR(h->peer_write);
    Py_CLEAR(h->peer_closing);
    Py_CLEAR(h->unsettled);
    Py_CLEAR(h->apis);
    Py_CLEAR(h->pending);
    Py_CLEAR(h->checks);
    Py_CLEAR(h->arrivals);
    Py_CLEAR(h->unsettle);
    Py_CLEAR(h->kick);
    Py_CLEAR(h->inflight);
    Py_CLEAR(h->inflight_check);
    Py_CLEAR(h->scan);
    Py_CLEAR(h->scanned);
    Py_CLEAR(h->counters);
    Py_CLEAR(h->last_check);
    return 0;
}

static void
Hop_dealloc(Hop *h)
{
    PyObject_GC_UnTrack(h);
    Hop_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *
Hop_bind(Hop *h, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"answers", "max_frame", "unsettled", "apis", "pending", "checks",
                             "arrivals", "unsettle", "kick", "inflight", "inflight_check",
                             "counters", "scan", "scanned", "kick_frames", "kick_bytes",
                             "max_inflight", NULL};
    int answers;
    Py_ssize_t max_frame, max_inflight;
    long long kick_frames, kick_bytes;
    PyObject *o[12];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "pnO!O!O!O!OOOOOO!OOLLn:bind", kwlist,
                                     &answers, &max_frame, &PyList_Type, &o[0],
                                     &PyDict_Type, &o[1], &PyDict_Type, &o[2],
                                     &PyDict_Type, &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                                     &Counters_Type, &o[9], &o[10], &o[11], &kick_frames,
                                     &kick_bytes, &max_inflight))
        return NULL;
    if (!PyIter_Check(o[4])) {
        PyErr_SetString(PyExc_TypeError, "bind(): arrivals must be an iterator");
        return NULL;
    }
    if (PyObject_Size(o[7]) < 0)  /* (inflight: asked its length at every request) */
        return NULL;
    if (!PyCallable_Check(o[5]) || !PyCallable_Check(o[6]) || !PyCallable_Check(o[8]) ||
            (o[10] != Py_None && !PyCallable_Check(o[10]))) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(): unsettle, kick, inflight_check and scan must be callable");
        return NULL;
    }
    PyObject **to[12] = {&h->unsettled, &h->apis, &h->pending, &h->checks, &h->arrivals,
                         &h->unsettle, &h->kick, &h->inflight, &h->inflight_check,
                         (PyObject **)&h->counters, &h->scan, &h->scanned};
    for (int i = 0; i < 12; i++) {
        Py_INCREF(o[i]);
        Py_XSETREF(*to[i], o[i]);
    }
    Py_CLEAR(h->last_check);  /* (an answer check of the checks bound before) */
    h->answers = (char)answers;
    h->max_frame = max_frame;
    h->max_inflight = max_inflight;
    h->kick_frames = kick_frames;
    h->kick_bytes = kick_bytes;
    Py_RETURN_NONE;
}

static PyObject *
Hop_peer(Hop *h, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "peer(write, is_closing): two callables");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(h->peer_write, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(h->peer_closing, args[1]);
    Py_RETURN_NONE;
}

static PyObject *
Hop_get_fast(Hop *h, void *closure)
{
    return PyBool_FromLong(h->fast);
}

static int
Hop_set_fast(Hop *h, PyObject *value, void *closure)
{
    int on = value == NULL ? 0 : PyObject_IsTrue(value);
    if (on < 0)
        return -1;
    if (on && (h->unsettled == NULL || h->peer_write == NULL || h->peer_closing == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "a hop takes reads only once bound, with its peer");
        return -1;
    }
    h->fast = (char)on;
    return 0;
}

static PyGetSetDef Hop_getset[] = {
    {"fast", (getter)Hop_get_fast, (setter)Hop_set_fast,
     "Whether reads may take the short path in C (else each goes to _slow(data)); "
     "on only once bound (bind()) and given the other side (peer()).", NULL},
    {NULL}
};

static PyMemberDef Hop_members[] = {
    {"consumed", T_LONGLONG, offsetof(Hop, consumed), READONLY,
     "Bytes the short path in C forwarded (counted in the side's "
     "CutThrough.consumed)."},
    {NULL}
};

static PyMethodDef Hop_methods[] = {
    {"data_received", (PyCFunction)Hop_data_received, METH_O,
     "data_received(data): a read from this side (asyncio.Protocol)."},
    {"bind", (PyCFunction)(void (*)(void))Hop_bind, METH_VARARGS | METH_KEYWORDS,
     "bind(answers, max_frame, unsettled, apis, pending, checks, arrivals, unsettle, kick, "
     "inflight, inflight_check, counters, scan, scanned, kick_frames, kick_bytes, "
     "max_inflight): what the short path reads and writes (see "
     "kinspect.proxy.server.Connection)."},
    {"peer", (PyCFunction)(void (*)(void))Hop_peer, METH_FASTCALL,
     "peer(write, is_closing): the other side's transport's methods."},
    {NULL}
};

static PyTypeObject Hop_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.proxy._frames.Hop",
    .tp_basicsize = sizeof(Hop),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The short path of a side's reads, in C (a base of the side's protocol "
              "class, which defines _slow(data) for every other read).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Hop_dealloc,
    .tp_traverse = (traverseproc)Hop_traverse,
    .tp_clear = (inquiry)Hop_clear,
    .tp_methods = Hop_methods,
    .tp_members = Hop_members,
    .tp_getset = Hop_getset,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kinspect.proxy._frames",
    "Frames read into their own bytes objects (see kinspect.proxy.server.CutThrough), "
    "and the short path of reads (Hop, Counters).", -1,
    NULL,
};

PyMODINIT_FUNC
PyInit__frames(void)
{
    if (PyType_Ready(&FrameBuffer_Type) < 0 || PyType_Ready(&Counters_Type) < 0 ||
            PyType_Ready(&Hop_Type) < 0)
        return NULL;
    if (str_slow == NULL && (str_slow = PyUnicode_InternFromString("_slow")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    PyTypeObject *types[3] = {&FrameBuffer_Type, &Counters_Type, &Hop_Type};
    const char *names[3] = {"FrameBuffer", "Counters", "Hop"};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(m, "ABI", FRAMES_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
