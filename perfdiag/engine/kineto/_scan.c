/* The fast Kineto reader's parser: a strict JSON scanner for the events of a traceEvents
 * array, writing the complete ('X') events' fields straight into column buffers.
 *
 * It reads only what Python's json (the general reader) reads the same way, and answers
 * "not readable here" for everything else: then the general reader reads the file and
 * words the error, if there is one. So it refuses, rather than interprets: keys with escapes,
 * a key it reads given twice, a number of another shape than the column wants (1.0 as an
 * integer, a timestamp with an exponent), numbers beyond
 * MAX_NUMBER, escaped surrogates, non-strict JSON of any kind (NaN, trailing commas), and
 * nesting deeper than MAX_DEPTH. Strings are checked as strict UTF-8, as json.loads decodes
 * bytes. Escaped strings are handed over raw, flagged, and decoded by Python.
 *
 * A Scanner is fed the array's text piece by piece. scan(buffer, first) parses whole events
 * from the start of `buffer` (just after the array's '[' or after a ',' between events),
 * stops before the first event that is not followed by ',' or ']' within the buffer, and
 * appends the complete events to columns that grow across pieces; columns() hands them over
 * at the end, one chunk per column. The events whose text Python must decode (names starting
 * with one of the Scanner's prefixes, and escaped names, which a prefix test cannot judge)
 * come back from each scan as (index, start, stop) while their text is at hand. The parse
 * runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* baseline on x86-64: 16 bytes of a string checked at once */
#endif

#define MAX_DEPTH 256
#define MAX_NUMBER 9000000000000000LL /* json_shape.MAX_NUMBER: both readers refuse this */

enum { OK = 0, MORE = 1, BAD = 2 };
enum { T_NONE = 0, T_STRING, T_NUMBER, T_TRUE, T_FALSE, T_NULL, T_OBJECT, T_ARRAY };

typedef struct {
    int type;
    size_t start, end;   /* a string's text between its quotes; a number's text */
    int escaped;         /* a string holds a backslash escape */
    int integral;        /* a number has neither fraction nor exponent */
} Value;

/* The keys read; args' keys are read inside "args" only. */
enum { K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS, N_KEYS };
enum { A_CORRELATION, A_DEVICE, A_STREAM, N_ARGS };
/* The key sets read: an event's, its args' (inside "args" only), none (an object only
 * validated). */
enum { KEYS_NONE, KEYS_EVENT, KEYS_ARGS };

typedef struct {
    Value key[N_KEYS];
    Value arg[N_ARGS];
} Event;

typedef struct {
    char *data;
    size_t len, cap;
} Buffer;

static int reserve(Buffer *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int append(Buffer *b, const void *src, size_t n) {
    if (b->len + n > b->cap && reserve(b, n)) return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int append_byte(Buffer *b, unsigned char byte) {
    if (b->len + 1 > b->cap && reserve(b, 1)) return -1;
    b->data[b->len++] = (char)byte;
    return 0;
}

typedef struct {
    const char *text;
    size_t len;
} Key;

/* A string column: int32 offsets, UTF-8 data, one validity byte and one escape byte a row. */
typedef struct {
    Buffer offsets, data, valid, escaped;
} Strings;

/* An int64 or float64 column: 8-byte values and one validity byte a row. */
typedef struct {
    Buffer values, valid;
} Numbers;

enum { S_CAT, S_NAME, S_PIS, S_TIS, N_STRINGS };
enum { N_PID, N_TID, N_TS, N_DUR, N_CORRELATION, N_DEVICE, N_STREAM, N_NUMBERS };

typedef struct {
    Buffer rows; /* int64: a complete event's index in traceEvents */
    Strings strings[N_STRINGS];
    Numbers numbers[N_NUMBERS];
    size_t room; /* rows every fixed-size buffer holds: one check a row, not one a buffer */
} Columns;

typedef struct {
    Key *items;
    int count;
} Prefixes;

/* A run of spaces (indentation), 8 bytes at a time where the byte order allows. */
static inline size_t skip_spaces(const unsigned char *s, size_t p, size_t n) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (p + 8 <= n) {
        uint64_t word;
        memcpy(&word, s + p, 8);
        uint64_t other = word ^ 0x2020202020202020ULL; /* zero bytes: spaces */
        if (other) return p + ((size_t)__builtin_ctzll(other) >> 3);
        p += 8;
    }
#endif
    while (p < n && s[p] == ' ') p++;
    return p;
}

static inline size_t skip_blanks(const unsigned char *s, size_t p, size_t n) {
    while (p < n) {
        unsigned char c = s[p];
        if (c > ' ') return p; /* most often: no blank at all */
        if (c == ' ' && p + 1 < n && s[p + 1] > ' ') return p + 1; /* or one space (": ") */
        if (c == ' ') p = skip_spaces(s, p, n);
        else if (c == '\n' || c == '\r' || c == '\t') p++;
        else return p;
    }
    return p;
}

static inline int hex(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The bytes a string's scan must look at: the quote, the backslash, control characters and
 * the lead bytes of UTF-8 sequences. */
static unsigned char SPECIAL[256];

static void init_special(void) {
    for (int c = 0; c < 256; c++) SPECIAL[c] = c < 0x20 || c == '"' || c == '\\' || c >= 0x80;
}

/* A string from just after its opening quote; *p ends just after the closing quote. */
static int parse_string(const unsigned char *s, size_t n, size_t *p, Value *v) {
    size_t i = *p;
    v->type = T_STRING;
    v->start = i;
    v->escaped = 0;
    for (;;) {
#if defined(__SSE2__)
        /* The quote, the backslash, and (signed) bytes below 0x20: controls and the UTF-8
         * bytes from 0x80 — SPECIAL's bytes. */
        while (i + 16 <= n) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i stop = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                             _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
            int mask = _mm_movemask_epi8(stop);
            if (mask) {
                i += (size_t)__builtin_ctz((unsigned)mask);
                goto special;
            }
            i += 16;
        }
#else
        while (i + 4 <= n && !(SPECIAL[s[i]] | SPECIAL[s[i + 1]] | SPECIAL[s[i + 2]] |
                               SPECIAL[s[i + 3]]))
            i += 4;
#endif
        while (i < n && !SPECIAL[s[i]]) i++;
        if (i >= n) return MORE;
#if defined(__SSE2__)
    special:;
#endif
        unsigned char c = s[i];
        if (c == '"') break;
        if (c < 0x20) return BAD;
        if (c == '\\') {
            if (i + 1 >= n) return MORE;
            unsigned char e = s[i + 1];
            v->escaped = 1;
            if (e == 'u') {
                if (i + 5 >= n) return MORE;
                int code = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hex(s[i + k]);
                    if (h < 0) return BAD;
                    code = code * 16 + h;
                }
                if (code >= 0xD800 && code <= 0xDFFF) return BAD; /* surrogates: Python's job */
                i += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                i += 2;
            } else {
                return BAD;
            }
            continue;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        /* Strict UTF-8: no overlong forms, no surrogates, nothing beyond U+10FFFF. */
        size_t len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return BAD;
        if (i + len > n) return MORE;
        if (s[i + 1] < lo || s[i + 1] > hi) return BAD;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return BAD;
        i += len;
    }
    v->end = i;
    *p = i + 1;
    return OK;
}

static inline int p_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* A number in JSON's grammar; reaching the end of the buffer is MORE (a value is always
 * followed by ',', '}' or ']' inside an event). */
/* Past a run of digits, 8 at a time where the byte order allows (a timestamp has 16). */
static inline size_t skip_digits(const unsigned char *s, size_t i, size_t n) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (i + 8 <= n) {
        uint64_t word;
        memcpy(&word, s + i, 8);
        /* 0x80 in each byte that is not a digit: '0'..'9' are 0x30..0x39. */
        uint64_t low = word - 0x3030303030303030ULL, high = word + 0x4646464646464646ULL;
        uint64_t other = (low | high) & 0x8080808080808080ULL;
        if (other) return i + ((size_t)__builtin_ctzll(other) >> 3);
        i += 8;
    }
#endif
    while (i < n && p_digit(s[i])) i++;
    return i;
}

static int parse_number(const unsigned char *s, size_t n, size_t *p, Value *v) {
    size_t i = *p;
    v->type = T_NUMBER;
    v->start = i;
    v->integral = 1;
    if (i < n && s[i] == '-') i++;
    if (i >= n) return MORE;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9') {
        i = skip_digits(s, i, n);
    } else return BAD;
    if (i >= n) return MORE;
    if (s[i] == '.') {
        v->integral = 0;
        i++;
        if (i >= n) return MORE;
        if (!p_digit(s[i])) return BAD;
        i = skip_digits(s, i, n);
        if (i >= n) return MORE;
    }
    if (s[i] == 'e' || s[i] == 'E') {
        v->integral = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n) return MORE;
        if (!p_digit(s[i])) return BAD;
        while (i < n && p_digit(s[i])) i++;
        if (i >= n) return MORE;
    }
    v->end = i;
    *p = i;
    return OK;
}

static int parse_literal(const unsigned char *s, size_t n, size_t *p, const char *word,
                         int type, Value *v) {
    size_t len = strlen(word);
    size_t have = n - *p < len ? n - *p : len;
    if (memcmp(s + *p, word, have) != 0) return BAD;
    if (have < len) return MORE;
    v->type = type;
    v->start = *p;
    *p += len;
    v->end = *p;
    return OK;
}

static int parse_value(const unsigned char *s, size_t n, size_t *p, Value *v, int depth);
static int parse_members(const unsigned char *s, size_t n, size_t *p, Value *found, int keys,
                         Event *event, int depth);

/* An object or array from its opening bracket, validated and skipped. */
static int parse_container(const unsigned char *s, size_t n, size_t *p, Value *v, int depth) {
    if (depth > MAX_DEPTH) return BAD;
    v->start = *p;
    if (s[*p] == '{') {
        v->type = T_OBJECT;
        int r = parse_members(s, n, p, NULL, KEYS_NONE, NULL, depth);
        v->end = *p;
        return r;
    }
    v->type = T_ARRAY;
    size_t i = skip_blanks(s, *p + 1, n);
    if (i >= n) return MORE;
    if (s[i] == ']') {
        *p = i + 1;
        v->end = *p;
        return OK;
    }
    for (;;) {
        Value item;
        int r = parse_value(s, n, &i, &item, depth + 1);
        if (r != OK) return r;
        i = skip_blanks(s, i, n);
        if (i >= n) return MORE;
        if (s[i] == ']') {
            *p = i + 1;
            v->end = *p;
            return OK;
        }
        if (s[i] != ',') return BAD;
        i = skip_blanks(s, i + 1, n);
        if (i >= n) return MORE;
    }
}

static int parse_value(const unsigned char *s, size_t n, size_t *p, Value *v, int depth) {
    if (*p >= n) return MORE;
    switch (s[*p]) {
    case '"':
        (*p)++;
        return parse_string(s, n, p, v);
    case '{':
    case '[':
        return parse_container(s, n, p, v, depth);
    case 't':
        return parse_literal(s, n, p, "true", T_TRUE, v);
    case 'f':
        return parse_literal(s, n, p, "false", T_FALSE, v);
    case 'n':
        return parse_literal(s, n, p, "null", T_NULL, v);
    default:
        return parse_number(s, n, p, v);
    }
}

static inline int same(const unsigned char *text, const char *word, size_t len) {
    return memcmp(text, word, len) == 0; /* a constant length: compiled inline */
}

/* The index of a key among the set's, -1 for another key: by length first (most keys read
 * past are none of these), then the few bytes. */
static inline int find_key(const unsigned char *s, const Value *key, int keys) {
    size_t len = key->end - key->start;
    const unsigned char *t = s + key->start;
    if (keys == KEYS_EVENT) {
        switch (len) {
        case 2:
            if (same(t, "ph", 2)) return K_PH;
            if (same(t, "ts", 2)) return K_TS;
            return -1;
        case 3:
            if (same(t, "cat", 3)) return K_CAT;
            if (same(t, "pid", 3)) return K_PID;
            if (same(t, "tid", 3)) return K_TID;
            if (same(t, "dur", 3)) return K_DUR;
            return -1;
        case 4:
            if (same(t, "name", 4)) return K_NAME;
            if (same(t, "args", 4)) return K_ARGS;
            return -1;
        default:
            return -1;
        }
    }
    if (keys == KEYS_ARGS) {
        if (len == 11 && same(t, "correlation", 11)) return A_CORRELATION;
        if (len == 6 && same(t, "device", 6)) return A_DEVICE;
        if (len == 6 && same(t, "stream", 6)) return A_STREAM;
    }
    return -1;
}

/* An object's members, from its '{'; the values of `keys` go to `found` (type T_NONE when
 * absent). The event's "args" object is read the same way, one level down; an object read
 * for no key is only validated. */
static int parse_members(const unsigned char *s, size_t n, size_t *p, Value *found, int keys,
                         Event *event, int depth) {
    size_t i = skip_blanks(s, *p + 1, n); /* *p is at '{' */
    if (i >= n) return MORE;
    if (s[i] == '}') {
        *p = i + 1;
        return OK;
    }
    for (;;) {
        Value key, value;
        int r;
        if (s[i] != '"') return BAD;
        i++;
        if ((r = parse_string(s, n, &i, &key)) != OK) return r;
        if (key.escaped && keys != KEYS_NONE) return BAD; /* "n\u0061me" is "name" to json */
        i = skip_blanks(s, i, n);
        if (i >= n) return MORE;
        if (s[i] != ':') return BAD;
        i = skip_blanks(s, i + 1, n);
        if (i >= n) return MORE;
        int k = find_key(s, &key, keys);
        if (k >= 0 && found[k].type != T_NONE) return BAD; /* json.loads keeps the last */
        if (event && k == K_ARGS && s[i] == '{') {
            value.type = T_OBJECT;
            value.start = i;
            r = parse_members(s, n, &i, event->arg, KEYS_ARGS, NULL, depth + 1);
            if (r != OK) return r;
            value.end = i;
        } else if (s[i] == '"') { /* most values: a string or a number, read here */
            i++;
            if ((r = parse_string(s, n, &i, &value)) != OK) return r;
        } else if (p_digit(s[i]) || s[i] == '-') {
            if ((r = parse_number(s, n, &i, &value)) != OK) return r;
        } else if ((r = parse_value(s, n, &i, &value, depth + 1)) != OK) {
            return r;
        }
        if (k >= 0) found[k] = value;
        i = skip_blanks(s, i, n);
        if (i >= n) return MORE;
        if (s[i] == '}') {
            *p = i + 1;
            return OK;
        }
        if (s[i] != ',') return BAD;
        i = skip_blanks(s, i + 1, n);
        if (i >= n) return MORE;
    }
}

/* An integer of JSON's grammar below MAX_NUMBER; 0 when it is not one. */
static int read_integer(const unsigned char *s, const Value *v, int64_t *out) {
    if (v->type != T_NUMBER || !v->integral) return 0;
    size_t i = v->start;
    int negative = s[i] == '-';
    if (negative) i++;
    if (v->end - i > 16) return 0;
    int64_t value = 0;
    for (; i < v->end; i++) value = value * 10 + (s[i] - '0');
    if (value >= MAX_NUMBER) return 0;
    *out = negative ? -value : value;
    return 1;
}

/* A timestamp in thousandths, rounded half to even as the general reader's
 * Decimal.quantize; 0 for an exponent or a value out of range. */
static int read_thousandths(const unsigned char *s, const Value *v, int64_t *out) {
    if (v->type != T_NUMBER) return 0;
    size_t i = v->start;
    int negative = s[i] == '-';
    if (negative) i++;
    int64_t whole = 0;
    int digits = 0;
    for (; i < v->end && p_digit(s[i]); i++, digits++) whole = whole * 10 + (s[i] - '0');
    if (digits > 16 || whole >= MAX_NUMBER) return 0;
    int64_t fraction = 0;
    int decimals = 0;
    int next = -1;    /* the first digit dropped */
    int beyond = 0;   /* a nonzero digit after it */
    if (i < v->end && s[i] == '.') {
        for (i++; i < v->end && p_digit(s[i]); i++) {
            if (decimals < 3) {
                fraction = fraction * 10 + (s[i] - '0');
                decimals++;
            } else if (next < 0) {
                next = s[i] - '0';
            } else if (s[i] != '0') {
                beyond = 1;
            }
        }
    }
    if (i != v->end) return 0; /* an exponent */
    for (; decimals < 3; decimals++) fraction *= 10;
    int64_t value = whole * 1000 + fraction;
    if (next > 5 || (next == 5 && (beyond || value % 2 == 1))) value++;
    *out = negative ? -value : value;
    return 1;
}

/* A float64 as Python's float() reads it (both round correctly); 0 outside the range. An
 * integer is converted exactly as Python converts an int ("-0" is 0.0, not -0.0). */
static int read_float(const unsigned char *s, const Value *v, double *out) {
    int64_t integer;
    if (read_integer(s, v, &integer)) {
        *out = (double)integer;
        return 1;
    }
    if (v->type != T_NUMBER) return 0;
    /* Clinger's fast path: with at most 15 digits and no exponent the value is digits / 10^k,
     * both exact doubles, and one IEEE division rounds it correctly — as strtod and Python's
     * float do. Kineto's durations ("31.389") are all read so, without strtod. */
    static const double POW10[16] = {1e0, 1e1, 1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
    size_t i = v->start;
    int negative = s[i] == '-';
    if (negative) i++;
    uint64_t digits = 0;
    int count = 0, decimals = 0;
    for (; i < v->end && p_digit(s[i]); i++, count++) digits = digits * 10 + (s[i] - '0');
    if (i < v->end && s[i] == '.')
        for (i++; i < v->end && p_digit(s[i]); i++, count++, decimals++)
            digits = digits * 10 + (s[i] - '0');
    if (i == v->end && count <= 15 && FLT_EVAL_METHOD == 0) {
        double value = (double)digits / POW10[decimals];
        if (negative) value = -value;
        if (!(value > -(double)MAX_NUMBER && value < (double)MAX_NUMBER)) return 0;
        *out = value;
        return 1;
    }
    char text[64];
    size_t len = v->end - v->start;
    if (len >= sizeof text) return 0;
    memcpy(text, s + v->start, len);
    text[len] = 0;
    char *end;
    double value = strtod(text, &end);
    if (end != text + len) return 0; /* a locale with another decimal point */
    if (!(value > -(double)MAX_NUMBER && value < (double)MAX_NUMBER)) return 0;
    *out = value;
    return 1;
}

/* Room for one more row in every fixed-size buffer (string data grows on its own). */
static int reserve_row(Columns *out) {
    size_t rows = out->rows.len / 8;
    if (rows < out->room) return 0;
    size_t room = out->room ? out->room * 2 : 4096;
    if (reserve(&out->rows, (room - rows) * 8)) return -1;
    for (int k = 0; k < N_STRINGS; k++) {
        Strings *c = &out->strings[k];
        if (reserve(&c->offsets, (room - rows) * 4) || reserve(&c->valid, room - rows) ||
            reserve(&c->escaped, room - rows))
            return -1;
    }
    for (int k = 0; k < N_NUMBERS; k++) {
        Numbers *c = &out->numbers[k];
        if (reserve(&c->values, (room - rows) * 8) || reserve(&c->valid, room - rows)) return -1;
    }
    out->room = room;
    return 0;
}

/* Writes into room made by reserve_row. */
static inline void put(Buffer *b, const void *value, size_t n) {
    memcpy(b->data + b->len, value, n);
    b->len += n;
}

static inline void put_byte(Buffer *b, unsigned char byte) { b->data[b->len++] = (char)byte; }

static int push_string(Strings *c, const unsigned char *s, const Value *v) {
    unsigned char present = v->type == T_STRING;
    unsigned char escaped = present && v->escaped;
    if (present && append(&c->data, s + v->start, v->end - v->start)) return -1;
    if (c->data.len > INT32_MAX) return -1;
    int32_t offset = (int32_t)c->data.len;
    put(&c->offsets, &offset, 4);
    put_byte(&c->valid, present);
    put_byte(&c->escaped, escaped);
    return 0;
}

static inline void push_number(Numbers *c, const void *value, unsigned char present) {
    put(&c->values, value, 8);
    put_byte(&c->valid, present);
}

enum { NO_MEMORY = 3 };

static inline int absent(const Value *v) { return v->type == T_NONE || v->type == T_NULL; }

/* The complete event's columns; BAD when a value is of a type the general reader reads
 * otherwise (or refuses). */
static int commit(Columns *out, const unsigned char *s, const Event *e, int64_t row) {
    const Value *key = e->key;
    const Value none = {T_NONE, 0, 0, 0, 0};
    for (int k = K_CAT; k <= K_NAME; k++)
        if (key[k].type != T_STRING && !absent(&key[k])) return BAD;
    int64_t ids[2] = {0, 0};
    unsigned char id_valid[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const Value *v = &key[K_PID + k];
        if (v->type == T_NUMBER) {
            if (!read_integer(s, v, &ids[k])) return BAD;
            id_valid[k] = 1;
        } else if (v->type != T_STRING && !absent(v)) {
            return BAD;
        }
    }
    /* A string timestamp is read as a number by the general reader: not here. */
    int64_t ts = 0;
    double dur = 0;
    unsigned char ts_valid = !absent(&key[K_TS]), dur_valid = !absent(&key[K_DUR]);
    if (ts_valid && !read_thousandths(s, &key[K_TS], &ts)) return BAD;
    if (dur_valid && !read_float(s, &key[K_DUR], &dur)) return BAD;
    int64_t args[N_ARGS] = {0, 0, 0};
    unsigned char args_valid[N_ARGS] = {0, 0, 0};
    if (key[K_ARGS].type == T_OBJECT) {
        for (int a = 0; a < N_ARGS; a++) {
            const Value *v = &e->arg[a];
            if (v->type == T_NUMBER) {
                if (!read_integer(s, v, &args[a])) return BAD;
                args_valid[a] = 1;
            } else if (v->type != T_STRING && !absent(v)) {
                return BAD;
            }
        }
    }
    Strings *str = out->strings;
    Numbers *num = out->numbers;
    if (reserve_row(out)) return NO_MEMORY;
    put(&out->rows, &row, 8);
    if (push_string(&str[S_CAT], s, &key[K_CAT]) || push_string(&str[S_NAME], s, &key[K_NAME]) ||
        push_string(&str[S_PIS], s, key[K_PID].type == T_STRING ? &key[K_PID] : &none) ||
        push_string(&str[S_TIS], s, key[K_TID].type == T_STRING ? &key[K_TID] : &none))
        return NO_MEMORY;
    push_number(&num[N_PID], &ids[0], id_valid[0]);
    push_number(&num[N_TID], &ids[1], id_valid[1]);
    push_number(&num[N_TS], &ts, ts_valid);
    push_number(&num[N_DUR], &dur, dur_valid);
    push_number(&num[N_CORRELATION], &args[0], args_valid[0]);
    push_number(&num[N_DEVICE], &args[1], args_valid[1]);
    push_number(&num[N_STREAM], &args[2], args_valid[2]);
    return OK;
}

typedef struct {
    size_t consumed; /* bytes read: whole events and their separators */
    int closed;      /* the array's ']' was read (consumed counts it) */
    int64_t events;  /* traceEvents entries read */
} Progress;

/* Whether Python must decode the event: its name starts with a prefix, or has an escape. */
static int wanted(const unsigned char *s, const Value *name, const Prefixes *prefixes) {
    if (name->type != T_STRING) return 0;
    if (name->escaped) return 1;
    size_t len = name->end - name->start;
    for (int k = 0; k < prefixes->count; k++) {
        const Key *prefix = &prefixes->items[k];
        if (prefix->len <= len && s[name->start] == (unsigned char)prefix->text[0] &&
            memcmp(s + name->start, prefix->text, prefix->len) == 0)
            return 1;
    }
    return 0;
}

/* `first_row`: the traceEvents index of the buffer's first event. `decode` gets int64
 * triples (index, start, stop) of the complete events Python must decode. */
static int scan_events(const unsigned char *s, size_t n, int first, int64_t first_row,
                       const Prefixes *prefixes, Columns *out, Buffer *decode, Progress *at) {
    size_t p = 0;
    at->consumed = 0;
    at->closed = 0;
    at->events = 0;
    for (;;) {
        p = skip_blanks(s, p, n);
        if (p >= n) return OK;
        if (first && s[p] == ']') {
            at->consumed = p + 1;
            at->closed = 1;
            return OK;
        }
        if (s[p] != '{') return BAD; /* not an object: the general reader words it */
        size_t start = p;
        Event event;
        for (int k = 0; k < N_KEYS; k++) event.key[k].type = T_NONE; /* absent until read */
        for (int k = 0; k < N_ARGS; k++) event.arg[k].type = T_NONE;
        int r = parse_members(s, n, &p, event.key, KEYS_EVENT, &event, 1);
        if (r == MORE) return OK;
        if (r != OK) return r;
        size_t q = skip_blanks(s, p, n);
        if (q >= n) return OK; /* ',' or ']' not here yet: the event is read again */
        if (s[q] != ',' && s[q] != ']') return BAD;
        const Value *ph = &event.key[K_PH];
        if (ph->type == T_STRING && ph->escaped) return BAD;
        if (ph->type == T_STRING && ph->end - ph->start == 1 && s[ph->start] == 'X') {
            int64_t row = first_row + at->events;
            r = commit(out, s, &event, row);
            if (r != OK) return r;
            if (wanted(s, &event.key[K_NAME], prefixes)) {
                int64_t triple[3] = {row, (int64_t)start, (int64_t)p};
                if (append(decode, triple, sizeof triple)) return NO_MEMORY;
            }
        }
        at->events++;
        at->consumed = q + 1;
        if (s[q] == ']') {
            at->closed = 1;
            return OK;
        }
        p = q + 1;
        first = 0;
    }
}

static void free_columns(Columns *c) {
    free(c->rows.data);
    for (int k = 0; k < N_STRINGS; k++) {
        free(c->strings[k].offsets.data);
        free(c->strings[k].data.data);
        free(c->strings[k].valid.data);
        free(c->strings[k].escaped.data);
    }
    for (int k = 0; k < N_NUMBERS; k++) {
        free(c->numbers[k].values.data);
        free(c->numbers[k].valid.data);
    }
}

/* A column buffer handed to Python without a copy: read-only, freed with the object (Arrow
 * keeps a reference while an array uses it). */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} Block;

static char EMPTY[8]; /* an empty block's address: Arrow refuses a null one */

static int Block_getbuffer(Block *self, Py_buffer *view, int flags) {
    void *data = self->data ? self->data : EMPTY;
    return PyBuffer_FillInfo(view, (PyObject *)self, data, self->len, 1, flags);
}

static void Block_dealloc(Block *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs BLOCK_BUFFER = {(getbufferproc)Block_getbuffer, NULL};

static PyTypeObject BLOCK_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "perfdiag.engine.kineto._scan.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)Block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column buffer of the scanner (the buffer protocol, read-only).",
    .tp_as_buffer = &BLOCK_BUFFER,
};

/* The buffer as a Block, which takes its memory over (the Buffer is left empty). */
static PyObject *block_of(Buffer *b) {
    Block *block = PyObject_New(Block, &BLOCK_TYPE);
    if (!block) return NULL;
    char *data = b->len ? realloc(b->data, b->len) : NULL; /* give back the spare capacity */
    block->data = data ? data : b->data;
    block->len = (Py_ssize_t)b->len;
    if (!b->len) {
        free(b->data);
        block->data = NULL;
    }
    b->data = NULL;
    b->len = b->cap = 0;
    return (PyObject *)block;
}

static PyObject *columns_of(Columns *out) {
    PyObject *strings = PyTuple_New(N_STRINGS), *numbers = PyTuple_New(N_NUMBERS);
    if (!strings || !numbers) goto fail;
    for (int k = 0; k < N_STRINGS; k++) {
        Strings *c = &out->strings[k];
        PyObject *item = Py_BuildValue("(NNNN)", block_of(&c->offsets), block_of(&c->data),
                                       block_of(&c->valid), block_of(&c->escaped));
        if (!item) goto fail;
        PyTuple_SET_ITEM(strings, k, item);
    }
    for (int k = 0; k < N_NUMBERS; k++) {
        Numbers *c = &out->numbers[k];
        PyObject *item = Py_BuildValue("(NN)", block_of(&c->values), block_of(&c->valid));
        if (!item) goto fail;
        PyTuple_SET_ITEM(numbers, k, item);
    }
    return Py_BuildValue("(NNN)", block_of(&out->rows), strings, numbers);
fail:
    Py_XDECREF(strings);
    Py_XDECREF(numbers);
    return NULL;
}

typedef struct {
    PyObject_HEAD
    Columns out;
    Prefixes prefixes;
    int64_t events; /* traceEvents entries read so far */
    int busy;       /* a scan runs (without the GIL): no second one on the same Scanner */
} Scanner;

static void clear_scanner(Scanner *self) {
    free_columns(&self->out);
    memset(&self->out, 0, sizeof self->out);
    for (int k = 0; k < self->prefixes.count; k++) free((void *)self->prefixes.items[k].text);
    free(self->prefixes.items);
    self->prefixes.items = NULL;
    self->prefixes.count = 0;
}

static int start_columns(Columns *out) {
    int32_t zero = 0;
    for (int k = 0; k < N_STRINGS; k++)
        if (append(&out->strings[k].offsets, &zero, 4)) return -1;
    return 0;
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwargs) {
    PyObject *prefixes;
    static char *keywords[] = {"prefixes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!", keywords, &PyTuple_Type, &prefixes))
        return -1;
    clear_scanner(self);
    self->events = 0;
    Py_ssize_t count = PyTuple_GET_SIZE(prefixes);
    self->prefixes.items = calloc((size_t)count + 1, sizeof(Key));
    if (!self->prefixes.items || start_columns(&self->out)) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item = PyTuple_GET_ITEM(prefixes, k);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "prefixes must be bytes");
            return -1;
        }
        size_t len = (size_t)PyBytes_GET_SIZE(item);
        char *text = malloc(len + 1);
        if (!text) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(text, PyBytes_AS_STRING(item), len + 1);
        self->prefixes.items[k].text = text;
        self->prefixes.items[k].len = len;
        self->prefixes.count++;
    }
    return 0;
}

static void Scanner_dealloc(Scanner *self) {
    clear_scanner(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *decode_list(const Buffer *decode) {
    const int64_t *triples = (const int64_t *)decode->data;
    Py_ssize_t count = (Py_ssize_t)(decode->len / (3 * sizeof(int64_t)));
    PyObject *list = PyList_New(count);
    if (!list) return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item = Py_BuildValue("(LLL)", (long long)triples[3 * k],
                                       (long long)triples[3 * k + 1], (long long)triples[3 * k + 2]);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, item);
    }
    return list;
}

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    Py_buffer view;
    int first;
    if (!PyArg_ParseTuple(args, "y*p", &view, &first)) return NULL;
    if (self->busy || !self->prefixes.items) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Scanner: not initialized, or already scanning");
        return NULL;
    }
    self->busy = 1;
    Buffer decode = {NULL, 0, 0};
    Progress at = {0, 0, 0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan_events((const unsigned char *)view.buf, (size_t)view.len, first, self->events,
                         &self->prefixes, &self->out, &decode, &at);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (status == NO_MEMORY) {
        PyErr_NoMemory();
    } else if (status != OK) {
        result = Py_BuildValue("(OnniO)", Py_False, (Py_ssize_t)0, (Py_ssize_t)0, 0, Py_None);
    } else {
        self->events += at.events;
        PyObject *wanted_events = decode_list(&decode);
        if (wanted_events)
            result = Py_BuildValue("(OnniN)", Py_True, (Py_ssize_t)at.consumed,
                                   (Py_ssize_t)at.events, at.closed, wanted_events);
    }
    free(decode.data);
    return result;
}

static PyObject *Scanner_columns(Scanner *self, PyObject *unused) {
    (void)unused;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner: scanning");
        return NULL;
    }
    PyObject *columns = columns_of(&self->out);
    free_columns(&self->out);
    memset(&self->out, 0, sizeof self->out);
    if (start_columns(&self->out)) {
        Py_XDECREF(columns);
        return PyErr_NoMemory();
    }
    return columns;
}

static PyObject *Scanner_held(Scanner *self, PyObject *unused) {
    (void)unused;
    size_t most = 0;
    for (int k = 0; k < N_STRINGS; k++)
        if (self->out.strings[k].data.len > most) most = self->out.strings[k].data.len;
    return PyLong_FromSize_t(most);
}

static PyMethodDef SCANNER_METHODS[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan(buffer, first) -> (readable, consumed, events, closed, decode)\n\n"
     "readable False: the general reader must read the file (decode is None)."},
    {"columns", (PyCFunction)Scanner_columns, METH_NOARGS,
     "columns() -> (rows, strings, numbers): the complete events read since the last call."},
    {"held", (PyCFunction)Scanner_held, METH_NOARGS,
     "held() -> the bytes of the largest string column held (int32 offsets: < 2 GiB)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SCANNER_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "perfdiag.engine.kineto._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(prefixes): the complete events of a traceEvents array, piece by piece.",
    .tp_methods = SCANNER_METHODS,
    .tp_init = (initproc)Scanner_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------
 * The Squeezer: a trace's JSON text with its padding squeezed out, piece by piece, before
 * either reader holds it. Outside strings a run of blanks is kept as its first byte (one
 * blank still separates two tokens: "1 2" stays what it was); strings are copied as they are.
 * It stops at the first byte outside a string that no JSON text Python's json reads can hold
 * there (the text is not JSON from there on, whatever follows: that byte is kept, for the
 * parser to name it), and at a string longer than its limit. So what a reader holds follows
 * the tokens of a file, not blanks or garbage, however many; a squeeze examines each byte once.
 */
enum { GOING = 0, STOP_GARBAGE = 1, STOP_LONG = 2 };

static unsigned char OUTSIDE[256]; /* 0: a byte of a token, 1: a blank, 2: a quote, 3: garbage */
static unsigned char STRING_STOP[256]; /* the quote and the backslash */

static void init_squeeze(void) {
    /* Tokens as json reads them: punctuation, numbers, true false null NaN Infinity. */
    static const char TOKEN[] = "{}[],:0123456789+-.eEaflnrstuyINi";
    for (int c = 0; c < 256; c++) OUTSIDE[c] = 3;
    for (const char *t = TOKEN; *t; t++) OUTSIDE[(unsigned char)*t] = 0;
    OUTSIDE[' '] = OUTSIDE['\t'] = OUTSIDE['\n'] = OUTSIDE['\r'] = 1;
    OUTSIDE['"'] = 2;
    STRING_STOP['"'] = STRING_STOP['\\'] = 1;
}

typedef struct {
    PyObject_HEAD
    long long limit;      /* the most bytes a string may hold between its quotes */
    int in_string, escape, blank, stopped;
    long long length;     /* bytes of the current string so far */
    long long read, kept; /* bytes consumed, bytes written */
    long long string_at;  /* the offset read of the current (or last) string's opening quote */
    long long string_kept; /* ... and the offset written */
    int busy;
} Squeezer;

/* Squeezes s[0..n) into `out` (NULL: count only), writing at most `cap` bytes (the write
 * that would pass it is not made: its byte is not consumed); returns the bytes consumed. */
static size_t squeeze(Squeezer *q, const unsigned char *s, size_t n, unsigned char *out,
                      size_t cap, size_t *written) {
    size_t i = 0, k = 0;
#define EMIT(from, count)                                   \
    do {                                                    \
        if (out) memcpy(out + k, s + (from), (count));      \
        k += (count);                                       \
    } while (0)
    while (i < n && q->stopped == GOING) {
        if (q->in_string) {
            size_t j = i + (q->escape ? 1 : 0); /* an escaped byte, whatever it is */
            while (j < n && !STRING_STOP[s[j]]) j++;
            size_t run = j - i;
            if ((long long)run > q->limit - q->length) {
                q->stopped = STOP_LONG;
                break;
            }
            if (run > cap - k) run = cap - k;
            EMIT(i, run);
            q->length += (long long)run;
            if (run) q->escape = 0;
            i += run;
            if (i < j || i == n || k == cap) break; /* the cap, or the end of the input */
            if (s[i] == '\\') {
                if (q->length + 1 > q->limit) {
                    q->stopped = STOP_LONG;
                    break;
                }
                q->length++;
                q->escape = 1;
            } else {
                q->in_string = 0;
            }
            EMIT(i, 1);
            i++;
            continue;
        }
        unsigned char kind = OUTSIDE[s[i]];
        if (kind == 1) {
            if (!q->blank) {
                if (k == cap) break;
                EMIT(i, 1);
                q->blank = 1;
            }
            /* A run of one blank repeated (indentation, padding) is skipped a word at a time. */
            uint64_t same = 0x0101010101010101ULL * s[i], word;
            i++;
            while (i + 8 <= n && (memcpy(&word, s + i, 8), word == same)) i += 8;
            while (i < n && OUTSIDE[s[i]] == 1) i++;
            continue;
        }
        if (k == cap) break;
        q->blank = 0;
        if (kind == 0) {
            size_t j = i + 1;
            while (j < n && OUTSIDE[s[j]] == 0) j++;
            if (j - i > cap - k) j = i + (cap - k);
            EMIT(i, j - i);
            i = j;
        } else if (kind == 2) {
            q->string_at = q->read + (long long)i;
            q->string_kept = q->kept + (long long)k;
            EMIT(i, 1);
            q->in_string = 1;
            q->escape = 0;
            q->length = 0;
            i++;
        } else {
            EMIT(i, 1);
            i++;
            q->stopped = STOP_GARBAGE;
        }
    }
#undef EMIT
    q->read += (long long)i;
    q->kept += (long long)k;
    *written = k;
    return i;
}

static int Squeezer_init(Squeezer *self, PyObject *args, PyObject *kwargs) {
    long long limit;
    static char *keywords[] = {"limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L", keywords, &limit)) return -1;
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "Squeezer: a negative limit");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Squeezer: squeezing");
        return -1;
    }
    self->limit = limit;
    self->in_string = self->escape = self->blank = self->stopped = 0;
    self->length = self->read = self->kept = 0;
    self->string_at = self->string_kept = -1;
    return 0;
}

static PyObject *Squeezer_squeeze(Squeezer *self, PyObject *args, PyObject *kwargs) {
    Py_buffer view;
    PyObject *into;
    long long upto = -1;
    static char *keywords[] = {"data", "into", "upto", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*O|L", keywords, &view, &into, &upto))
        return NULL;
    if (into != Py_None && !PyByteArray_Check(into)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "Squeezer.squeeze: `into` must be a bytearray or None");
        return NULL;
    }
    if (self->busy) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Squeezer: already squeezing");
        return NULL;
    }
    size_t n = (size_t)view.len, cap = n, written = 0;
    if (upto >= 0) {
        long long room = upto > self->kept ? upto - self->kept : 0;
        if ((unsigned long long)room < cap) cap = (size_t)room;
    }
    Py_ssize_t had = 0;
    Py_buffer target = {0};
    unsigned char *out = NULL;
    if (into != Py_None) {
        had = PyByteArray_GET_SIZE(into);
        /* Held while the GIL is released: nothing can resize `into` meanwhile. */
        if (PyByteArray_Resize(into, had + (Py_ssize_t)cap) < 0 ||
            PyObject_GetBuffer(into, &target, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        out = (unsigned char *)target.buf + had;
    }
    self->busy = 1;
    size_t consumed;
    Py_BEGIN_ALLOW_THREADS
    consumed = squeeze(self, (const unsigned char *)view.buf, n, out, cap, &written);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyBuffer_Release(&view);
    if (into != Py_None) {
        PyBuffer_Release(&target);
        if (PyByteArray_Resize(into, had + (Py_ssize_t)written) < 0) return NULL;
    }
    return PyLong_FromSize_t(consumed);
}

static PyMethodDef SQUEEZER_METHODS[] = {
    {"squeeze", (PyCFunction)(void (*)(void))Squeezer_squeeze, METH_VARARGS | METH_KEYWORDS,
     "squeeze(data, into, upto=-1) -> the bytes of data consumed\n\n"
     "Appends the squeezed text to the bytearray `into` (None: counts only). Stops at garbage "
     "or a string above the limit (`stopped` says which), or before writing the byte at "
     "offset `upto` of the squeezed text."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Squeezer_stopped(Squeezer *self, void *unused) {
    (void)unused;
    return PyLong_FromLong(self->stopped);
}

static PyObject *Squeezer_read(Squeezer *self, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(self->read);
}

static PyObject *Squeezer_kept(Squeezer *self, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(self->kept);
}

static PyObject *Squeezer_string_at(Squeezer *self, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(self->string_at);
}

static PyObject *Squeezer_string_kept(Squeezer *self, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(self->string_kept);
}

static PyGetSetDef SQUEEZER_GETSET[] = {
    {"stopped", (getter)Squeezer_stopped, NULL,
     "0: going on; 1: a byte that JSON cannot hold there (written); 2: a string above the limit",
     NULL},
    {"read", (getter)Squeezer_read, NULL, "bytes consumed", NULL},
    {"kept", (getter)Squeezer_kept, NULL, "bytes written", NULL},
    {"string_at", (getter)Squeezer_string_at, NULL,
     "the offset read of the last string's opening quote (-1: none yet)", NULL},
    {"string_kept", (getter)Squeezer_string_kept, NULL,
     "the offset written of the last string's opening quote (-1: none yet)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SQUEEZER_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "perfdiag.engine.kineto._scan.Squeezer",
    .tp_basicsize = sizeof(Squeezer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Squeezer(limit): JSON text without its padding, piece by piece; strings of at "
              "most `limit` bytes.",
    .tp_methods = SQUEEZER_METHODS,
    .tp_getset = SQUEEZER_GETSET,
    .tp_init = (initproc)Squeezer_init,
    .tp_new = PyType_GenericNew,
};


/* ------------------------------------------------------------------------------------------
 * prune(text, event=False): a whole JSON text validated as Python's json.loads (strict) reads
 * it, and the arrays and objects that no reader keeps blanked out in place: their bytes
 * between the brackets become spaces, so the text keeps its length and every position (a
 * parse error is where it was), and json.loads builds an empty array or object there instead
 * of one Python object per value. Kept: the top-level object's traceEvents (each event's
 * ph cat name pid tid ts dur, and args), distributedInfo (its scalars), and in args the
 * collective arguments the readers decode. Any other array or object that is a value of a
 * trace's top-level object, of distributedInfo, of an event, of args, or a value the readers
 * want a scalar for, is blanked (`event`: the text is one event). A value is blanked only once
 * it is read whole and valid, so a text that is not JSON fails where it failed. Nesting deeper
 * than PRUNE_DEPTH stops the walk (status 2), as does the first error (status 1).
 */
#define PRUNE_DEPTH 512
/* P_BLANK: a value to blank if it is an array or object; P_SKIP: inside one blanked. */
enum { P_SKIP, P_BLANK, P_TOP, P_INFO, P_EVENTS, P_EVENT, P_ARGS, P_KEEP };
enum { S_FIRST, S_NEXT, S_COLON, S_VALUE, S_AFTER };

typedef struct {
    unsigned char object, ctx, state, value_ctx;
    size_t blank_from; /* the opening bracket of a value to blank; SIZE_MAX: kept */
} Frame;

static const char *const ARGS_KEPT[] = {
    "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
    "Process Group Name", "Process Group Ranks", "Seq", "Process Group ID", "Input Dims",
    "Input type", NULL};

/* A key as json decodes it, when it is short ASCII (any other matches no kept key). */
static int key_text(const unsigned char *s, size_t start, size_t end, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = start; i < end; i++) {
        unsigned c = s[i];
        if (c == '\\') {
            c = s[++i];
            if (c == 'u') {
                unsigned v = 0;
                for (int d = 1; d <= 4; d++) {
                    unsigned h = s[i + d];
                    v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                i += 4;
                c = v;
            } else if (c == 'b') c = '\b';
            else if (c == 'f') c = '\f';
            else if (c == 'n') c = '\n';
            else if (c == 'r') c = '\r';
            else if (c == 't') c = '\t';
        }
        if (c >= 0x80 || k + 1 >= cap) return 0;
        out[k++] = (char)c;
    }
    out[k] = 0;
    return 1;
}

static int kept_key(const char *const *kept, const char *key) {
    for (; *kept; kept++)
        if (!strcmp(*kept, key)) return 1;
    return 0;
}

/* The context of a member's value: what it is to the readers. */
static unsigned char member_ctx(unsigned char ctx, const unsigned char *s, size_t start,
                                size_t end) {
    char key[32];
    if (ctx == P_SKIP || ctx == P_KEEP) return ctx;
    if (!key_text(s, start, end, key, sizeof key)) return P_BLANK;
    if (ctx == P_TOP)
        return !strcmp(key, "traceEvents") ? P_EVENTS
               : !strcmp(key, "distributedInfo") ? P_INFO
                                                  : P_BLANK;
    if (ctx == P_EVENT) return !strcmp(key, "args") ? P_ARGS : P_BLANK;
    if (ctx == P_ARGS) return kept_key(ARGS_KEPT, key) ? P_KEEP : P_BLANK;
    return P_BLANK; /* P_INFO: its scalars only */
}

static size_t skip_ws(const unsigned char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static int p_hex(unsigned char c) {
    return p_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* A scalar at s[i] as json reads it; returns its end, or 0 when there is none. */
static size_t scalar_end(const unsigned char *s, size_t n, size_t i) {
    const char *word = NULL;
    switch (s[i]) {
    case 'n': word = "null"; break;
    case 't': word = "true"; break;
    case 'f': word = "false"; break;
    case 'N': word = "NaN"; break;
    case 'I': word = "Infinity"; break;
    case '-':
        if (i + 1 < n && s[i + 1] == 'I') word = "-Infinity";
        break;
    }
    if (word) {
        size_t len = strlen(word);
        return n - i >= len && !memcmp(s + i, word, len) ? i + len : 0;
    }
    size_t j = i;
    if (j < n && s[j] == '-') j++;
    if (j < n && s[j] == '0') j++;
    else if (j < n && p_digit(s[j]))
        while (j < n && p_digit(s[j])) j++;
    else return 0;
    if (j + 1 < n && s[j] == '.' && p_digit(s[j + 1])) {
        j += 2;
        while (j < n && p_digit(s[j])) j++;
    }
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
        size_t e = j + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        if (e < n && p_digit(s[e])) {
            while (e < n && p_digit(s[e])) e++;
            j = e;
        }
    }
    return j;
}

/* A string whose opening quote is s[i]: the index after its closing quote, or 0. */
static size_t string_end(const unsigned char *s, size_t n, size_t i) {
    for (i++; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (++i >= n) return 0;
            c = s[i];
            if (c == 'u') {
                if (n - i < 5) return 0;
                for (int d = 1; d <= 4; d++)
                    if (!p_hex(s[i + d])) return 0;
                i += 4;
            } else if (!strchr("\"\\/bfnrt", c) || !c) {
                return 0;
            }
        }
    }
    return 0;
}

enum { PRUNED = 0, PRUNE_ERROR = 1, PRUNE_DEEP = 2 };

static int prune_text(unsigned char *s, size_t n, int event, size_t *at, size_t *blanked) {
    Frame stack[PRUNE_DEPTH + 1];
    int depth = 0; /* frames in use */
    unsigned char ctx = event ? P_EVENT : P_TOP; /* the context of the value to read */
    size_t i = skip_ws(s, n, 0);
    *blanked = 0;
    for (;;) {
        /* Read a value at i, in context ctx. */
        if (i >= n) goto fail;
        if (s[i] == '{' || s[i] == '[') {
            if (depth == PRUNE_DEPTH) {
                *at = i;
                return PRUNE_DEEP;
            }
            Frame *f = &stack[depth++];
            f->object = s[i] == '{';
            int kept = ctx == P_KEEP || ctx == P_SKIP ||
                       (f->object ? ctx == P_TOP || ctx == P_INFO || ctx == P_EVENT ||
                                        ctx == P_ARGS
                                  : ctx == P_EVENTS);
            f->blank_from = kept ? SIZE_MAX : i;
            f->ctx = kept ? ctx : P_SKIP;
            f->state = S_FIRST;
            i = skip_ws(s, n, i + 1);
        } else {
            size_t end = s[i] == '"' ? string_end(s, n, i) : scalar_end(s, n, i);
            if (!end) goto fail;
            i = skip_ws(s, n, end);
            if (!depth) break;
            stack[depth - 1].state = S_AFTER;
        }
        /* Punctuation until the next value. */
        for (;;) {
            if (!depth) goto done;
            Frame *f = &stack[depth - 1];
            if (i >= n) goto fail;
            unsigned char c = s[i];
            unsigned char close = f->object ? '}' : ']';
            if (f->state == S_AFTER && c == ',') {
                f->state = S_NEXT;
                i = skip_ws(s, n, i + 1);
                if (!f->object) break;
                continue;
            }
            if (f->state == S_AFTER || (f->state == S_FIRST && c == close)) {
                if (c != close) goto fail;
                if (f->blank_from != SIZE_MAX && i > f->blank_from + 1) {
                    memset(s + f->blank_from + 1, ' ', i - f->blank_from - 1);
                    *blanked += i - f->blank_from - 1;
                }
                depth--;
                i = skip_ws(s, n, i + 1);
                if (depth) stack[depth - 1].state = S_AFTER;
                continue;
            }
            if (!f->object) break; /* an element */
            if (f->state == S_FIRST || f->state == S_NEXT) {
                if (c != '"') goto fail;
                size_t end = string_end(s, n, i);
                if (!end) goto fail;
                f->value_ctx = member_ctx(f->ctx, s, i + 1, end - 1);
                f->state = S_COLON;
                i = skip_ws(s, n, end);
                continue;
            }
            if (f->state == S_COLON) {
                if (c != ':') goto fail;
                f->state = S_VALUE;
                i = skip_ws(s, n, i + 1);
                break;
            }
            goto fail;
        }
        Frame *f = &stack[depth - 1];
        ctx = f->object ? f->value_ctx : f->ctx == P_EVENTS ? P_EVENT : f->ctx;
    }
done:
    if (i != n) goto fail;
    *at = n;
    return PRUNED;
fail:
    *at = i;
    return PRUNE_ERROR;
}

static PyObject *prune(PyObject *module, PyObject *args, PyObject *kwargs) {
    PyObject *text;
    int event = 0;
    static char *keywords[] = {"text", "event", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Y|p", keywords, &text, &event)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(text, &view, PyBUF_WRITABLE) < 0) return NULL;
    size_t at = 0, blanked = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = prune_text((unsigned char *)view.buf, (size_t)view.len, event, &at, &blanked);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("inn", status, (Py_ssize_t)at, (Py_ssize_t)blanked);
}

static PyMethodDef MODULE_METHODS[] = {
    {"prune", (PyCFunction)(void (*)(void))prune, METH_VARARGS | METH_KEYWORDS,
     "prune(text: bytearray, event=False) -> (status, position, bytes blanked): 0 valid JSON, "
     "1 not JSON at position, 2 nested deeper than 512 at position."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, MODULE_METHODS,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    init_special();
    init_squeeze();
    if (PyType_Ready(&SCANNER_TYPE) < 0 || PyType_Ready(&BLOCK_TYPE) < 0 ||
        PyType_Ready(&SQUEEZER_TYPE) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&MODULE);
    if (!module) return NULL;
    Py_INCREF(&SCANNER_TYPE);
    if (PyModule_AddObject(module, "Scanner", (PyObject *)&SCANNER_TYPE) < 0) {
        Py_DECREF(&SCANNER_TYPE);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&SQUEEZER_TYPE);
    if (PyModule_AddObject(module, "Squeezer", (PyObject *)&SQUEEZER_TYPE) < 0) {
        Py_DECREF(&SQUEEZER_TYPE);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
