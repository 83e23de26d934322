/*
 * kinspect.codec._native: the fast path of the spec-driven decoder, in C.
 *
 * A Program describes how one spec struct is laid out on the wire at one message
 * version (built once per (struct, version) by kinspect.codec.compiler from the
 * same decisions its generated Python decoder makes): a list of operations, one per
 * field in spec order, each reading one field from the wire or setting the field's
 * default, then the struct's tag section. decode() walks the buffer with those
 * programs and builds the same value classes (their __slots__ are written directly).
 *
 * The wire formats are the Kafka protocol guide's, with KIP-482 (compact types,
 * unsigned varints, tag sections) and KIP-893 (nullable structs), and the proposed
 * per-field "encoding" (packed zig-zag / upacked unsigned varints).
 *
 * Contract with the Python side: decode() returns (value, end_offset) when the
 * bytes decode, and None when they do not (truncated, lengths or counts past the
 * end, negative lengths in non-nullable fields, over-long varints, values
 * out of range, too deep). It never reads outside buf[pos:end], checks every count
 * against the bytes left before allocating for it, and grows lists of structs or
 * strings as their elements are read. On None the caller runs the
 * generated Python decoder, which either succeeds the same way or raises the precise
 * DecodeError, so this file only has to be right about what it accepts. Non-empty
 * tag sections are handed to the generated Python tag-section function of the
 * struct (they are rare, and that function knows every tagged field's type).
 *
 * scan() walks the same programs without building anything and returns the end
 * offset and the tags of the top-level tag section; it accepts everything decode()
 * accepts (it does not look inside strings or tagged fields) and applies the
 * decoder's rules to tag sections (any order, no tag repeated, no tag of a field
 * not tagged at this version).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* operation kinds */
enum {
    K_FIXED = 1,    /* fixed-width primitive: type */
    K_PACKED,       /* zig-zag varint of type bits */
    K_UPACKED,      /* unsigned varint of type bits */
    K_STRING,       /* compact/nullable string */
    K_BYTES,        /* compact/nullable bytes or records */
    K_ARRAY,        /* array of primitives (type) or of structs (sub) */
    K_STRUCT,       /* struct field (nullable: int8 marker, KIP-893; negative = null) */
    K_CONST,        /* default: a shared immutable constant */
    K_NEWLIST,      /* default: a new empty list */
    K_NEWSTRUCT,    /* default: a new struct with every field at its default */
};

/* primitive types */
enum {
    T_BOOL_ = 1, T_I8, T_I16, T_U16, T_I32, T_U32, T_I64, T_F64, T_UUID,
    T_STR, T_BYTES_,
};

static const int FIXED_SIZE[] = {0, 1, 1, 2, 2, 4, 4, 8, 8, 16, 0, 0};

#define MAX_DEPTH 64

/* Bumped whenever the module's behaviour or interface changes: kinspect.codec.native
 * refuses a stale build (an editable install keeps the old .so until rebuilt). */
#define NATIVE_ABI 8

typedef struct Program Program;

typedef struct {
    int kind;
    int type;           /* primitive type (elements, for K_ARRAY of primitives) */
    int compact;
    int nullable;
    int bits;           /* K_PACKED / K_UPACKED */
    Py_ssize_t offset;  /* slot offset in the instance */
    PyObject *obj;      /* K_CONST value */
    Program *sub;       /* struct program (K_ARRAY of structs, K_STRUCT, K_NEWSTRUCT) */
} Op;

struct Program {
    PyObject_HEAD
    PyTypeObject *cls;
    Py_ssize_t unknown_off;
    int flexible;
    int ready;
    PyObject *tagfunc;      /* generated Python tag-section function, or NULL */
    uint32_t *badtags;      /* tags of fields not tagged at this version (scan rejects) */
    Py_ssize_t nbadtags;
    Py_ssize_t nops, ndefs;
    Op *ops;                /* decode */
    Op *defs;               /* build an instance with every field at its default */
    PyObject *keep;         /* a tuple: the references the ops borrow (constants, sub
                               programs); immutable, so they live as long as it does */
};

static PyTypeObject Program_Type;

typedef struct {
    PyObject *bufobj;
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t end;
    int depth;
    /* elements that take no bytes (structs with nothing on the wire at this version)
     * still allowed in this walk: one per byte of it, as the Python decoder counts
     * them, so that nested arrays of them cannot build a number of objects that grows
     * with the square of the input */
    Py_ssize_t zero_left;
} Ctx;

/* ---------------------------------------------------------------- reading */

/* An unsigned varint of at most maxb bytes (5: the value must fit 32 bits; 10: 64
 * bits). Returns 0 on success. */
static inline int
rd_uv(Ctx *c, int maxb, uint64_t *out)
{
    Py_ssize_t p = c->pos;
    if (p < c->end) {
        unsigned b = c->buf[p];
        if (b < 0x80) {
            *out = b;
            c->pos = p + 1;
            return 0;
        }
    }
    uint64_t v = 0;
    int shift = 0;
    for (int i = 0; i < maxb; i++) {
        if (p >= c->end)
            return -1;
        unsigned b = c->buf[p++];
        if (shift == 63 && (b & 0x7e))
            return -1;  /* more than 64 bits */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (maxb == 5 && v > 0xFFFFFFFFull)
                return -1;
            *out = v;
            c->pos = p;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

static inline uint16_t ld16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t ld32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t ld64(const unsigned char *p)
{
    return ((uint64_t)ld32(p) << 32) | ld32(p + 4);
}

/* A fixed-width primitive at c->pos (bounds already checked by the caller). */
static inline PyObject *
fixed_value(int type, const unsigned char *p)
{
    switch (type) {
    case T_BOOL_: return PyBool_FromLong(p[0] != 0);
    case T_I8: return PyLong_FromLong((int8_t)p[0]);
    case T_I16: return PyLong_FromLong((int16_t)ld16(p));
    case T_U16: return PyLong_FromLong(ld16(p));
    case T_I32: return PyLong_FromLong((int32_t)ld32(p));
    case T_U32: return PyLong_FromUnsignedLong(ld32(p));
    case T_I64: return PyLong_FromLongLong((int64_t)ld64(p));
    case T_F64:
#if PY_VERSION_HEX >= 0x030B0000
        {
            double d = PyFloat_Unpack8((const char *)p, 0);
            if (d == -1.0 && PyErr_Occurred())
                return NULL;
            return PyFloat_FromDouble(d);
        }
#else
        {
            double d = _PyFloat_Unpack8(p, 0);
            if (d == -1.0 && PyErr_Occurred())
                return NULL;
            return PyFloat_FromDouble(d);
        }
#endif
    case T_UUID: return PyBytes_FromStringAndSize((const char *)p, 16);
    }
    PyErr_SetString(PyExc_SystemError, "kinspect native: bad fixed type");
    return NULL;
}

/* A length or count: compact (uvarint minus one, as a Java int) or a signed int16/int32.
 * Returns 0 on success. */
static inline int
rd_len(Ctx *c, int compact, int wide, int64_t *n)
{
    if (compact) {
        /* as Kafka's generated readers: readUnsignedVarint() - 1 in Java int
         * arithmetic, so a varint of 2^31 and above is a negative length (null),
         * and 2^31 itself wraps to INT32_MAX */
        uint64_t u;
        if (rd_uv(c, 5, &u))
            return -1;
        *n = (int32_t)(uint32_t)((uint32_t)u - 1u);
        return 0;
    }
    if (wide) {
        if (c->end - c->pos < 4)
            return -1;
        *n = (int32_t)ld32(c->buf + c->pos);
        c->pos += 4;
    } else {
        if (c->end - c->pos < 2)
            return -1;
        *n = (int16_t)ld16(c->buf + c->pos);
        c->pos += 2;
    }
    return 0;
}

/* "Did not decode": NULL with no exception set (an exception set means a real error,
 * such as a failed allocation, which the caller re-raises). */
#define FAIL NULL

static PyObject *decode_struct(Program *pg, Ctx *c);
static PyObject *default_struct(Program *pg, int depth);

/* string or bytes; returns a new reference, or NULL (no exception set = did not
 * decode) */
static PyObject *
rd_strbytes(Ctx *c, int is_str, int compact, int nullable)
{
    int64_t n;
    if (rd_len(c, compact, !is_str, &n))
        return FAIL;
    if (n < 0) {
        if (nullable)  /* any negative length is null, as Kafka reads it */
            Py_RETURN_NONE;
        return FAIL;
    }
    if (n > c->end - c->pos || (is_str && n > 0x7fff))  /* Kafka: strings <= 32767 bytes */
        return FAIL;
    const char *p = (const char *)c->buf + c->pos;
    c->pos += (Py_ssize_t)n;
    if (is_str) {
        /* invalid UTF-8 is kept as lone surrogates, as the Python decoders keep it
         * (Kafka's readString replaces it with U+FFFD rather than failing) */
        return PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, "surrogateescape");
    }
    return PyBytes_FromStringAndSize(p, (Py_ssize_t)n);
}

static PyObject *
rd_varint(Ctx *c, int kind, int bits)
{
    uint64_t u;
    if (rd_uv(c, bits == 64 ? 10 : 5, &u))
        return FAIL;
    if (kind == K_UPACKED) {
        uint64_t hi = bits == 64 ? 0x7FFFFFFFFFFFFFFFull : bits == 32 ? 0x7FFFFFFFull : 0x7FFFull;
        if (u > hi)
            return FAIL;
        return PyLong_FromLongLong((long long)u);
    }
    int64_t v = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
    if (bits == 16 && (v < -32768 || v > 32767))
        return FAIL;
    if (bits == 32 && (v < INT32_MIN || v > INT32_MAX))
        return FAIL;
    return PyLong_FromLongLong(v);
}

/* An array of primitives (op->type) or of structs (op->sub). */
static PyObject *
rd_array(const Op *op, Ctx *c)
{
    int64_t n;
    if (rd_len(c, op->compact, 1, &n))
        return FAIL;
    if (n < 0) {
        if (op->nullable)
            Py_RETURN_NONE;
        return FAIL;
    }
    Py_ssize_t left = c->end - c->pos;
    int t = op->type;
    Py_ssize_t size = op->sub == NULL ? FIXED_SIZE[t] : 0;
    if (size > 0 ? n > left / size : n > left)
        return FAIL;  /* checked before anything is allocated */
    if (size > 0) {
        /* every element is in the bytes left: allocate once and fill. Only C code
         * runs and nothing tracked by the garbage collector is allocated meanwhile,
         * so the half-filled list is never seen. */
        PyObject *list = PyList_New((Py_ssize_t)n);
        if (list == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
            PyObject *x = fixed_value(t, c->buf + c->pos);
            if (x == NULL) {
                Py_DECREF(list);  /* list_dealloc skips the NULL items */
                return NULL;
            }
            c->pos += size;
            PyList_SET_ITEM(list, i, x);
        }
        return list;
    }
    /* structs and strings: grown as elements are read, so a count the bytes do not
     * back costs nothing, and no list with missing items exists while a tag-section
     * function (Python) runs or the collector looks */
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        Py_ssize_t at = c->pos;
        PyObject *x = op->sub != NULL ? decode_struct(op->sub, c)
                                      : rd_strbytes(c, t == T_STR, op->compact, 0);
        if (x == NULL || PyList_Append(list, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(x);
        if (c->pos == at) {
            /* an element that takes no bytes (then they all do): the whole count is
             * checked against what the walk still allows once the first element
             * shows it, before the others are built */
            if (i == 0 && n > c->zero_left) {
                Py_DECREF(list);
                return FAIL;
            }
            c->zero_left--;
        }
    }
    return list;
}

static inline void
set_slot(PyObject *o, Py_ssize_t off, PyObject *v)
{
    PyObject **slot = (PyObject **)((char *)o + off);
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

/* The value of one default op (K_CONST, K_NEWLIST, K_NEWSTRUCT). */
static inline PyObject *
default_value(const Op *op, int depth)
{
    switch (op->kind) {
    case K_CONST:
        Py_INCREF(op->obj);
        return op->obj;
    case K_NEWLIST:
        return PyList_New(0);
    case K_NEWSTRUCT:
        return default_struct(op->sub, depth + 1);
    }
    PyErr_SetString(PyExc_SystemError, "kinspect native: bad default op");
    return NULL;
}

static PyObject *
default_struct(Program *pg, int depth)
{
    if (depth > MAX_DEPTH || !pg->ready)
        return FAIL;  /* declined: the Python decoder builds it */
    PyObject *o = pg->cls->tp_alloc(pg->cls, 0);
    if (o == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < pg->ndefs; i++) {
        const Op *op = &pg->defs[i];
        PyObject *v = default_value(op, depth);
        if (v == NULL) {
            Py_DECREF(o);
            return NULL;
        }
        set_slot(o, op->offset, v);
    }
    Py_INCREF(Py_None);
    set_slot(o, pg->unknown_off, Py_None);
    return o;
}

static PyObject *
decode_struct(Program *pg, Ctx *c)
{
    if (c->depth >= MAX_DEPTH || !pg->ready)
        return FAIL;
    c->depth++;
    PyObject *o = pg->cls->tp_alloc(pg->cls, 0);
    if (o == NULL)
        goto error;
    const Op *op = pg->ops;
    const Op *stop = op + pg->nops;
    for (; op < stop; op++) {
        PyObject *v;
        switch (op->kind) {
        case K_FIXED: {
            Py_ssize_t size = FIXED_SIZE[op->type];
            if (c->end - c->pos < size)
                goto error;
            v = fixed_value(op->type, c->buf + c->pos);
            c->pos += size;
            break;
        }
        case K_PACKED:
        case K_UPACKED:
            v = rd_varint(c, op->kind, op->bits);
            break;
        case K_STRING:
            v = rd_strbytes(c, 1, op->compact, op->nullable);
            break;
        case K_BYTES:
            v = rd_strbytes(c, 0, op->compact, op->nullable);
            break;
        case K_ARRAY:
            v = rd_array(op, c);
            break;
        case K_STRUCT:
            if (op->nullable) {
                if (c->pos >= c->end)
                    goto error;
                /* Kafka: a negative int8 marker is null, anything else present */
                int8_t m = (int8_t)c->buf[c->pos++];
                if (m < 0) {
                    Py_INCREF(Py_None);
                    v = Py_None;
                    break;
                }
            }
            v = decode_struct(op->sub, c);
            break;
        default:
            v = default_value(op, c->depth);
        }
        if (v == NULL)
            goto error;
        set_slot(o, op->offset, v);
    }
    /* tag section (KIP-482) */
    if (pg->flexible) {
        uint64_t cnt;
        if (rd_uv(c, 5, &cnt))
            goto error;
        if (cnt == 0) {
            Py_INCREF(Py_None);
            set_slot(o, pg->unknown_off, Py_None);
        } else {
            PyObject *args[5];
            args[0] = o;
            args[1] = c->bufobj;
            args[2] = PyLong_FromSsize_t(c->pos);
            args[3] = PyLong_FromSsize_t(c->end);
            args[4] = PyLong_FromUnsignedLongLong(cnt);
            PyObject *r = NULL;
            if (args[2] && args[3] && args[4])
                r = PyObject_Vectorcall(pg->tagfunc, args, 5, NULL);
            Py_XDECREF(args[2]);
            Py_XDECREF(args[3]);
            Py_XDECREF(args[4]);
            if (r == NULL)
                goto error;
            Py_ssize_t p = PyLong_AsSsize_t(r);
            Py_DECREF(r);
            if (p == -1 && PyErr_Occurred())
                goto error;
            if (p < c->pos || p > c->end) {
                PyErr_SetString(PyExc_SystemError,
                                "kinspect native: tag section function returned a bad offset");
                goto error;
            }
            c->pos = p;
        }
    } else {
        Py_INCREF(Py_None);
        set_slot(o, pg->unknown_off, Py_None);
    }
    c->depth--;
    return o;
error:
    c->depth--;
    Py_XDECREF(o);
    return NULL;
}

/* ---------------------------------------------------------------- scanning */

/* Advance over a string or bytes field without building it (UTF-8 not checked). */
static inline int
skip_strbytes(Ctx *c, int is_str, int compact, int nullable)
{
    int64_t n;
    if (rd_len(c, compact, !is_str, &n))
        return -1;
    if (n < 0)
        return nullable ? 0 : -1;
    if (n > c->end - c->pos || (is_str && n > 0x7fff))
        return -1;
    c->pos += (Py_ssize_t)n;
    return 0;
}

static int
cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether a tag repeats in the cnt (tag, size, data) entries of the tag section at
 * c->buf[pos:] (already walked once, so well-formed): 1 yes, 0 no, -1 with
 * MemoryError. Only called for sections not in ascending order. */
static int
tags_repeat(Ctx *c, Py_ssize_t pos, uint64_t cnt)
{
    uint32_t *t = PyMem_Malloc((size_t)cnt * sizeof(uint32_t));
    if (t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Ctx w = *c;
    w.pos = pos;
    for (uint64_t i = 0; i < cnt; i++) {
        uint64_t tag = 0, size = 0;
        rd_uv(&w, 5, &tag);
        rd_uv(&w, 5, &size);
        w.pos += (Py_ssize_t)size;
        t[i] = (uint32_t)tag;
    }
    qsort(t, (size_t)cnt, sizeof(uint32_t), cmp_u32);
    int rep = 0;
    for (uint64_t i = 1; i < cnt && !rep; i++)
        rep = t[i] == t[i - 1];
    PyMem_Free(t);
    return rep;
}

/* Advance over one struct as pg reads it, building nothing (but a passing int for a
 * packedN/upackedN field); with `tags`, append the tag numbers of its tag section, and
 * with `mask`, set the bit 1 << tag of each of them under 64 (nested structs get
 * neither: their tags are not the top level's). Checks at least what decode_struct
 * checks, except the contents of strings (UTF-8) and of tagged fields, so whatever
 * decodes scans to the same end. Returns 0, or -1 (an exception set only for a
 * failed allocation). */
static int
skip_struct(Program *pg, Ctx *c, PyObject *tags, uint64_t *mask)
{
    if (c->depth >= MAX_DEPTH || !pg->ready)
        return -1;
    c->depth++;
    const Op *op = pg->ops;
    const Op *stop = op + pg->nops;
    for (; op < stop; op++) {
        switch (op->kind) {
        case K_FIXED:
            if (c->end - c->pos < FIXED_SIZE[op->type])
                goto fail;
            c->pos += FIXED_SIZE[op->type];
            break;
        case K_PACKED:
        case K_UPACKED: {
            PyObject *v = rd_varint(c, op->kind, op->bits);  /* small: range-checked */
            if (v == NULL)
                goto fail;
            Py_DECREF(v);
            break;
        }
        case K_STRING:
        case K_BYTES:
            if (skip_strbytes(c, op->kind == K_STRING, op->compact, op->nullable))
                goto fail;
            break;
        case K_ARRAY: {
            int64_t n;
            if (rd_len(c, op->compact, 1, &n))
                goto fail;
            if (n < 0) {
                if (op->nullable)
                    break;
                goto fail;
            }
            Py_ssize_t left = c->end - c->pos;
            Py_ssize_t size = op->sub == NULL ? FIXED_SIZE[op->type] : 0;
            if (size > 0) {
                if (n > left / size)
                    goto fail;
                c->pos += (Py_ssize_t)n * size;
                break;
            }
            if (n > left)
                goto fail;
            for (int64_t i = 0; i < n; i++) {
                Py_ssize_t at = c->pos;
                if (op->sub != NULL ? skip_struct(op->sub, c, NULL, NULL)
                                    : skip_strbytes(c, op->type == T_STR, op->compact, 0))
                    goto fail;
                if (c->pos == at)
                    break;  /* elements that take no bytes: the rest are the same */
            }
            break;
        }
        case K_STRUCT:
            if (op->nullable) {
                if (c->pos >= c->end)
                    goto fail;
                int8_t m = (int8_t)c->buf[c->pos++];
                if (m < 0)
                    break;
            }
            if (skip_struct(op->sub, c, NULL, NULL))
                goto fail;
            break;
        default:  /* defaults: nothing on the wire */
            break;
        }
    }
    if (pg->flexible) {
        /* the decoder's rules for a tag section: tags in any order, none repeated,
         * none of a field that is not tagged at this version */
        uint64_t cnt;
        if (rd_uv(c, 5, &cnt) || cnt > (uint64_t)(c->end - c->pos))
            goto fail;
        Py_ssize_t section = c->pos;
        int64_t last = -1;
        int unordered = 0;
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t tag, size;
            if (rd_uv(c, 5, &tag) || rd_uv(c, 5, &size) || size > (uint64_t)(c->end - c->pos))
                goto fail;
            c->pos += (Py_ssize_t)size;
            if ((int64_t)tag <= last)
                unordered = 1;
            last = (int64_t)tag;
            for (Py_ssize_t k = 0; k < pg->nbadtags; k++)
                if (pg->badtags[k] == tag)
                    goto fail;
            if (mask != NULL && tag < 64)
                *mask |= (uint64_t)1 << tag;
            if (tags != NULL) {
                PyObject *t = PyLong_FromUnsignedLongLong(tag);
                if (t == NULL || PyList_Append(tags, t) < 0) {
                    Py_XDECREF(t);
                    goto fail;
                }
                Py_DECREF(t);
            }
        }
        if (unordered && tags_repeat(c, section, cnt))
            goto fail;
    }
    c->depth--;
    return 0;
fail:
    c->depth--;
    return -1;
}

/* The arguments (program, buf: bytes, pos, end) of decode(), scan() and scan_clear()
 * (whose fifth it leaves to the caller): 1 and *c set
 * up, 0 when buf[pos:end] is not within buf (not accepted), -1 with an exception. */
static int
walk_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, Program **pg, Ctx *c)
{
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &Program_Type) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *pg = (Program *)args[0];
    if (!(*pg)->ready) {
        PyErr_SetString(PyExc_ValueError, "program not set up");
        return -1;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    if (pos == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t end = PyLong_AsSsize_t(args[3]);
    if (end == -1 && PyErr_Occurred())
        return -1;
    if (pos < 0 || end < pos || end > PyBytes_GET_SIZE(args[1]))
        return 0;
    c->bufobj = args[1];
    c->buf = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    c->pos = pos;
    c->end = end;
    c->depth = 0;
    c->zero_left = end - pos;
    return 1;
}

/* scan(program, buf: bytes, pos: int, end: int) -> (end_offset, [top-level tags]) | None */
static PyObject *
native_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Program *pg;
    Ctx c;
    int ok = walk_args(args, nargs, "scan(program, buf: bytes, pos, end)", &pg, &c);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *tags = PyList_New(0);
    if (tags == NULL)
        return NULL;
    if (skip_struct(pg, &c, tags, NULL)) {
        Py_DECREF(tags);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(nN)", c.pos, tags);
}

/* scan_clear(program, buf: bytes, pos: int, end: int, triggers: int) -> bool: whether
 * buf[pos:end] scans to exactly end with no top-level tag t of bit 1 << t in triggers
 * (tags under 64). What the proxy asks of every response whose broker addresses can
 * only sit under some top-level tags, between reading it and forwarding it: it builds
 * no result (no tuple, no list of tags; only a packedN/upackedN field, which Kafka's
 * specs do not have, makes a passing int), so that the little it touches is all that
 * stands in the way. */
static PyObject *
native_scan_clear(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Program *pg;
    Ctx c;
    if (nargs != 5 || !PyLong_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "scan_clear(program, buf: bytes, pos, end, triggers: int)");
        return NULL;
    }
    uint64_t triggers = PyLong_AsUnsignedLongLong(args[4]);
    if (triggers == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    int ok = walk_args(args, 4, "scan_clear(program, buf: bytes, pos, end, triggers: int)",
                       &pg, &c);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    uint64_t found = 0;
    if (skip_struct(pg, &c, NULL, &found)) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE;
    }
    if (c.pos == c.end && (found & triggers) == 0)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* decode(program, buf: bytes, pos: int, end: int) -> (value, end_offset) | None */
static PyObject *
native_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Program *pg;
    Ctx c;
    int ok = walk_args(args, nargs, "decode(program, buf: bytes, pos, end)", &pg, &c);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *o = decode_struct(pg, &c);
    if (o == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *p = PyLong_FromSsize_t(c.pos);
    if (p == NULL) {
        Py_DECREF(o);
        return NULL;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(o);
        Py_DECREF(p);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, o);
    PyTuple_SET_ITEM(t, 1, p);
    return t;
}

/* default(program) -> a new instance with every field at its default */
static PyObject *
native_default(PyObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &Program_Type) || !((Program *)arg)->ready) {
        PyErr_SetString(PyExc_TypeError, "default(program): a set-up Program");
        return NULL;
    }
    PyObject *o = default_struct((Program *)arg, 0);
    if (o == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RecursionError, "defaults nested too deep");
    return o;
}

/* ---------------------------------------------------------------- Program */

/* The offset of an object slot of cls (a member descriptor of type T_OBJECT_EX). */
static Py_ssize_t
slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *d = PyObject_GetAttr((PyObject *)cls, name);
    if (d == NULL)
        return -1;
    if (Py_TYPE(d) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "%R of %s is not a slot", name, cls->tp_name);
        Py_DECREF(d);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    Py_ssize_t off = m->offset;
    int ok = m->type == T_OBJECT_EX && !(m->flags & READONLY);
    Py_DECREF(d);
    if (!ok || off <= 0 || off + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%R of %s is not a writable object slot", name,
                     cls->tp_name);
        return -1;
    }
    return off;
}

static int
check_type(int kind, int type, int bits, int has_sub)
{
    switch (kind) {
    case K_FIXED:
        return type >= T_BOOL_ && type <= T_UUID;
    case K_PACKED:
    case K_UPACKED:
        return bits == 16 || bits == 32 || bits == 64;
    case K_STRING:
    case K_BYTES:
    case K_CONST:
    case K_NEWLIST:
        return 1;
    case K_ARRAY:
        return has_sub || (type >= T_BOOL_ && type <= T_BYTES_);
    case K_STRUCT:
    case K_NEWSTRUCT:
        return has_sub;
    }
    return 0;
}

/* ops: a list of (kind, slot name, type, compact, nullable, bits, obj, sub program) */
static int
load_ops(Program *pg, PyObject *list, PyObject *keep, Op **out, Py_ssize_t *nout,
         int allow_reads)
{
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "ops must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    Op *ops = PyMem_Calloc(n ? n : 1, sizeof(Op));
    if (ops == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(list, i);
        PyObject *name, *obj, *sub;
        Op *op = &ops[i];
        if (!PyArg_ParseTuple(t, "iOiiiiOO", &op->kind, &name, &op->type, &op->compact,
                              &op->nullable, &op->bits, &obj, &sub))
            goto fail;
        int has_sub = sub != Py_None;
        if (has_sub && !(PyObject_TypeCheck(sub, &Program_Type))) {
            PyErr_SetString(PyExc_TypeError, "sub must be a Program or None");
            goto fail;
        }
        if (!check_type(op->kind, op->type, op->bits, has_sub) ||
            (!allow_reads && op->kind < K_CONST)) {
            PyErr_Format(PyExc_ValueError, "bad op %R", t);
            goto fail;
        }
        op->offset = slot_offset(pg->cls, name);
        if (op->offset < 0)
            goto fail;
        if (op->kind == K_CONST) {
            op->obj = obj;
            if (PyList_Append(keep, obj))
                goto fail;
        }
        if (has_sub) {
            op->sub = (Program *)sub;
            if (PyList_Append(keep, sub))
                goto fail;
        }
    }
    *out = ops;
    *nout = n;
    return 0;
fail:
    PyMem_Free(ops);
    return -1;
}

static PyObject *
Program_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *cls;
    if (!PyArg_ParseTuple(args, "O!", &PyType_Type, &cls))
        return NULL;
    Program *pg = (Program *)type->tp_alloc(type, 0);
    if (pg == NULL)
        return NULL;
    Py_INCREF(cls);
    pg->cls = (PyTypeObject *)cls;
    PyObject *u = PyUnicode_FromString("_unknown");
    if (u == NULL) {
        Py_DECREF(pg);
        return NULL;
    }
    pg->unknown_off = slot_offset(pg->cls, u);
    Py_DECREF(u);
    if (pg->unknown_off < 0) {
        Py_DECREF(pg);
        return NULL;
    }
    return (PyObject *)pg;
}

/* setup(ops, defaults, flexible, tagfunc, invalid_tags=()): may be called once */
static PyObject *
Program_setup(Program *pg, PyObject *args)
{
    PyObject *ops, *defs, *tagfunc, *bad = NULL;
    int flexible;
    if (!PyArg_ParseTuple(args, "OOpO|O", &ops, &defs, &flexible, &tagfunc, &bad))
        return NULL;
    if (pg->ready || pg->ops != NULL) {
        PyErr_SetString(PyExc_ValueError, "program already set up");
        return NULL;
    }
    if (flexible && !PyCallable_Check(tagfunc)) {
        PyErr_SetString(PyExc_TypeError, "a flexible program needs a tag-section function");
        return NULL;
    }
    if (!PyList_Check(ops) || !PyList_Check(defs)) {
        PyErr_SetString(PyExc_TypeError, "ops and defaults must be lists");
        return NULL;
    }
    if (bad != NULL && !PyTuple_Check(bad)) {
        PyErr_SetString(PyExc_TypeError, "invalid_tags must be a tuple of ints");
        return NULL;
    }
    Py_ssize_t nbad = bad == NULL ? 0 : PyTuple_GET_SIZE(bad);
    uint32_t *badtags = PyMem_Malloc((nbad ? nbad : 1) * sizeof(uint32_t));
    if (badtags == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < nbad; i++) {
        unsigned long t = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(bad, i));
        if (t == (unsigned long)-1 && PyErr_Occurred()) {
            PyMem_Free(badtags);
            return NULL;
        }
        if (t > 0xFFFFFFFFul) {
            PyMem_Free(badtags);
            PyErr_SetString(PyExc_ValueError, "a tag must fit 32 bits");
            return NULL;
        }
        badtags[i] = (uint32_t)t;
    }
    /* work on copies: the lists given cannot change under us while op tuples are
     * parsed (parsing looks attributes up on the class, which may run Python code) */
    ops = PyList_GetSlice(ops, 0, PyList_GET_SIZE(ops));
    defs = PyList_GetSlice(defs, 0, PyList_GET_SIZE(defs));
    PyObject *keep = PyList_New(0);
    Op *o1 = NULL, *o2 = NULL;
    Py_ssize_t n1, n2;
    if (ops == NULL || defs == NULL || keep == NULL)
        goto fail;
    if (load_ops(pg, ops, keep, &o1, &n1, 1))
        goto fail;
    if (load_ops(pg, defs, keep, &o2, &n2, 0))
        goto fail;
    pg->keep = PyList_AsTuple(keep);
    if (pg->keep == NULL)
        goto fail;
    Py_DECREF(keep);
    Py_DECREF(ops);
    Py_DECREF(defs);
    pg->ops = o1;
    pg->nops = n1;
    pg->defs = o2;
    pg->ndefs = n2;
    pg->flexible = flexible;
    pg->badtags = badtags;
    pg->nbadtags = nbad;
    if (flexible) {
        Py_INCREF(tagfunc);
        pg->tagfunc = tagfunc;
    }
    pg->ready = 1;
    Py_RETURN_NONE;
fail:
    PyMem_Free(o1);
    PyMem_Free(badtags);
    Py_XDECREF(ops);
    Py_XDECREF(defs);
    Py_XDECREF(keep);
    return NULL;
}

static int
Program_traverse(Program *pg, visitproc visit, void *arg)
{
    Py_VISIT(pg->cls);
    Py_VISIT(pg->tagfunc);
    Py_VISIT(pg->keep);
    return 0;
}

static int
Program_clear(Program *pg)
{
    /* ops keep borrowed pointers into keep: a cleared program decodes nothing */
    pg->ready = 0;
    Py_CLEAR(pg->tagfunc);
    Py_CLEAR(pg->keep);
    return 0;
}

static void
Program_dealloc(Program *pg)
{
    PyObject_GC_UnTrack(pg);
    Program_clear(pg);
    Py_CLEAR(pg->cls);
    PyMem_Free(pg->ops);
    PyMem_Free(pg->defs);
    PyMem_Free(pg->badtags);
    Py_TYPE(pg)->tp_free((PyObject *)pg);
}

static PyMethodDef Program_methods[] = {
    {"setup", (PyCFunction)Program_setup, METH_VARARGS,
     "setup(ops, defaults, flexible, tagfunc, invalid_tags=()): fix the program's "
     "operations (once); invalid_tags: tags of the struct's fields that are not tagged "
     "at this version (a scan rejects them, as the decoder does)."},
    {NULL}
};

static PyTypeObject Program_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kinspect.codec._native.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "How one spec struct is read at one message version (see the module).",
    .tp_new = Program_new,
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_traverse = (traverseproc)Program_traverse,
    .tp_clear = (inquiry)Program_clear,
    .tp_methods = Program_methods,
};

/* ---------------------------------------------------------------- encoding */

/* all_of(tp, x): whether x is a list whose items are all of exactly type tp. The
 * fast encoders (kinspect.codec.compiler) check arrays with it: struct.pack takes
 * bools for ints and small ints for bools, and a str or bytes would pass for a
 * sequence. One call per array instead of a Python loop. */
static PyObject *
native_all_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "all_of(tp, x) takes 2 arguments");
        return NULL;
    }
    PyObject *tp = args[0], *x = args[1];
    if (!PyList_CheckExact(x))
        Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(x);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((PyObject *)Py_TYPE(PyList_GET_ITEM(x, i)) != tp)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* One fixed-width value of struct code `code` at p, big-endian, if v is of exactly
 * the type the fast encoders take for it and in range: 1 written, 0 declined,
 * -1 error (exception set). */
static int
put_fixed(unsigned char *p, char code, PyObject *v)
{
    if (code == 'B') {  /* bool: True or False only */
        if (v == Py_True) { p[0] = 1; return 1; }
        if (v == Py_False) { p[0] = 0; return 1; }
        return 0;
    }
    if (code == 'd') {
        if (!PyFloat_CheckExact(v))
            return 0;
#if PY_VERSION_HEX >= 0x030B0000
        return PyFloat_Pack8(PyFloat_AS_DOUBLE(v), (char *)p, 0) < 0 ? -1 : 1;
#else
        return _PyFloat_Pack8(PyFloat_AS_DOUBLE(v), p, 0) < 0 ? -1 : 1;
#endif
    }
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow)
        return 0;
    if (x == -1 && PyErr_Occurred())
        return -1;
    uint64_t u = (uint64_t)x;
    switch (code) {
    case 'b': if (x < -128 || x > 127) return 0;
        p[0] = (unsigned char)u; return 1;
    case 'h': if (x < -32768 || x > 32767) return 0;
        p[0] = (unsigned char)(u >> 8); p[1] = (unsigned char)u; return 1;
    case 'H': if (x < 0 || x > 65535) return 0;
        p[0] = (unsigned char)(u >> 8); p[1] = (unsigned char)u; return 1;
    case 'i': if (x < INT32_MIN || x > INT32_MAX) return 0;
        break;
    case 'I': if (x < 0 || x > (long long)UINT32_MAX) return 0;
        break;
    case 'q':
        for (int k = 0; k < 8; k++)
            p[k] = (unsigned char)(u >> (56 - 8 * k));
        return 1;
    default:
        return 0;
    }
    p[0] = (unsigned char)(u >> 24); p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8); p[3] = (unsigned char)u;
    return 1;
}

static Py_ssize_t
code_size(char code)
{
    switch (code) {
    case 'B': case 'b': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': return 4;
    case 'q': case 'd': return 8;
    }
    return -1;
}

/* Append `n` bytes at tmp to the bytearray out. */
static int
append(PyObject *out, const unsigned char *tmp, Py_ssize_t n)
{
    Py_ssize_t old = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, old + n) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(out) + old, tmp, (size_t)n);
    return 0;
}

/* pack_run(out, codes, *values) -> bool: append the values (one struct code each:
 * b h H i I q int8..int64, B bool, d float64) big-endian to the bytearray out, as
 * struct.pack(">" + codes) would, when each is of exactly its type (int, bool,
 * float) and in range; False (nothing appended) otherwise. */
static PyObject *
native_pack_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || !PyByteArray_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])
            || PyBytes_GET_SIZE(args[1]) != nargs - 2 || nargs - 2 > 64) {
        PyErr_SetString(PyExc_TypeError, "pack_run(out: bytearray, codes: bytes, *values): "
                        "one code per value, at most 64");
        return NULL;
    }
    const char *codes = PyBytes_AS_STRING(args[1]);
    unsigned char tmp[64 * 8];
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 2; i < nargs; i++) {
        Py_ssize_t size = code_size(codes[i - 2]);
        if (size < 0) {
            PyErr_SetString(PyExc_ValueError, "pack_run: unknown code");
            return NULL;
        }
        int r = put_fixed(tmp + n, codes[i - 2], args[i]);
        if (r < 0)
            return NULL;
        if (r == 0)
            Py_RETURN_FALSE;
        n += size;
    }
    if (append(args[0], tmp, n) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* pack_array(out, code, compact, x) -> bool: append an array of fixed-width values
 * (struct code `code`, as in pack_run) to the bytearray out: its length (an
 * unsigned varint of count + 1 when compact, else an int32) and its elements, when
 * x is a list whose elements are all of exactly their type and in range; False
 * (nothing appended) otherwise. */
static PyObject *
native_pack_array(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyByteArray_CheckExact(args[0]) || !PyBytes_CheckExact(args[1])
            || PyBytes_GET_SIZE(args[1]) != 1) {
        PyErr_SetString(PyExc_TypeError, "pack_array(out: bytearray, code: bytes, compact, x)");
        return NULL;
    }
    char code = PyBytes_AS_STRING(args[1])[0];
    Py_ssize_t size = code_size(code);
    int compact = PyObject_IsTrue(args[2]);
    PyObject *x = args[3];
    if (size < 0 || compact < 0) {
        if (compact >= 0)
            PyErr_SetString(PyExc_ValueError, "pack_array: unknown code");
        return NULL;
    }
    if (!PyList_CheckExact(x))
        Py_RETURN_FALSE;
    Py_ssize_t cnt = PyList_GET_SIZE(x);
    if (cnt > INT32_MAX - 1)
        Py_RETURN_FALSE;
    unsigned char stack[512];
    size_t need = 5 + (size_t)cnt * (size_t)size;
    unsigned char *tmp = need <= sizeof stack ? stack : PyMem_Malloc(need);
    if (tmp == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = 0;
    if (compact) {
        uint32_t v = (uint32_t)cnt + 1;
        while (v >= 0x80) {
            tmp[n++] = (unsigned char)(v | 0x80);
            v >>= 7;
        }
        tmp[n++] = (unsigned char)v;
    } else {
        uint32_t v = (uint32_t)cnt;
        tmp[0] = (unsigned char)(v >> 24); tmp[1] = (unsigned char)(v >> 16);
        tmp[2] = (unsigned char)(v >> 8); tmp[3] = (unsigned char)v;
        n = 4;
    }
    PyObject *res = Py_True;
    for (Py_ssize_t i = 0; i < cnt; i++) {
        int r = put_fixed(tmp + n, code, PyList_GET_ITEM(x, i));
        if (r <= 0) {
            res = r < 0 ? NULL : Py_False;
            break;
        }
        n += size;
    }
    if (res == Py_True && append(args[0], tmp, n) < 0)
        res = NULL;
    if (tmp != stack)
        PyMem_Free(tmp);
    Py_XINCREF(res);
    return res;
}

static PyMethodDef module_methods[] = {
    {"pack_run", (PyCFunction)(void (*)(void))native_pack_run, METH_FASTCALL,
     "pack_run(out, codes, *values) -> whether the values were appended to out "
     "(exact types, in range), as struct.pack('>' + codes) writes them."},
    {"pack_array", (PyCFunction)(void (*)(void))native_pack_array, METH_FASTCALL,
     "pack_array(out, code, compact, x) -> whether the array x (a list of values of "
     "exact types, in range) was appended to out with its length."},
    {"all_of", (PyCFunction)(void (*)(void))native_all_of, METH_FASTCALL,
     "all_of(tp, x) -> whether x is a list of values of exactly type tp."},

    {"decode", (PyCFunction)(void (*)(void))native_decode, METH_FASTCALL,
     "decode(program, buf: bytes, pos: int, end: int) -> (value, end offset) or None "
     "when buf[pos:end] does not decode."},
    {"scan", (PyCFunction)(void (*)(void))native_scan, METH_FASTCALL,
     "scan(program, buf: bytes, pos: int, end: int) -> (end offset, [top-level tags]) or "
     "None: walks buf[pos:end] as decode() would, building nothing."},
    {"scan_clear", (PyCFunction)(void (*)(void))native_scan_clear, METH_FASTCALL,
     "scan_clear(program, buf: bytes, pos: int, end: int, triggers: int) -> whether "
     "buf[pos:end] scans to exactly end (as scan() would) with none of the top-level "
     "tags whose bits (1 << tag, tags under 64) are set in triggers."},
    {"default", (PyCFunction)native_default, METH_O,
     "default(program) -> a new instance with every field at its default."},
    {NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kinspect.codec._native",
    "Fast path of kinspect's spec-driven decoder (see kinspect.codec.compiler).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&Program_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&Program_Type);
    if (PyModule_AddObject(m, "Program", (PyObject *)&Program_Type) < 0) {
        Py_DECREF(&Program_Type);
        Py_DECREF(m);
        return NULL;
    }
#define ADD(name, v) if (PyModule_AddIntConstant(m, name, v) < 0) { Py_DECREF(m); return NULL; }
    ADD("ABI", NATIVE_ABI)
    ADD("K_FIXED", K_FIXED) ADD("K_PACKED", K_PACKED) ADD("K_UPACKED", K_UPACKED)
    ADD("K_STRING", K_STRING) ADD("K_BYTES", K_BYTES) ADD("K_ARRAY", K_ARRAY)
    ADD("K_STRUCT", K_STRUCT) ADD("K_CONST", K_CONST) ADD("K_NEWLIST", K_NEWLIST)
    ADD("K_NEWSTRUCT", K_NEWSTRUCT)
    ADD("T_BOOL", T_BOOL_) ADD("T_I8", T_I8) ADD("T_I16", T_I16) ADD("T_U16", T_U16)
    ADD("T_I32", T_I32) ADD("T_U32", T_U32) ADD("T_I64", T_I64) ADD("T_F64", T_F64)
    ADD("T_UUID", T_UUID) ADD("T_STR", T_STR) ADD("T_BYTES", T_BYTES_)
#undef ADD
    return m;
}
