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

#define FRAMES_ABI 1

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

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kinspect.proxy._frames",
    "Frames read into their own bytes objects (see kinspect.proxy.server.CutThrough).", -1,
    NULL,
};

PyMODINIT_FUNC
PyInit__frames(void)
{
    if (PyType_Ready(&FrameBuffer_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FrameBuffer_Type);
    if (PyModule_AddObject(m, "FrameBuffer", (PyObject *)&FrameBuffer_Type) < 0) {
        Py_DECREF(&FrameBuffer_Type);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "ABI", FRAMES_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
