/*
 * The column masks that pay for C: the string masks (mask-alphanum, show-first-4, show-last-4) in one pass over an
 * Arrow string array's buffers, and truncation's pass through its calendar table (FLOOR_THROUGH_TABLE, below).
 *
 * The rules are those of string_masks.py: per code point, ASCII digits become 'n', the bytes ( ) , . - @ stay,
 * every other code point becomes 'x'; a kept code point (one of the first `keep_first` or last `keep_last` of a
 * valid value) is copied as its original bytes. A code point starts at every byte that is not a UTF-8
 * continuation byte (10xxxxxx), which is how Arrow's utf8_length counts them; continuation bytes before a value's
 * first code point (invalid UTF-8) are dropped, as mask-alphanum's Arrow kernel drops them. Null slots are masked
 * whole. A kept code point with more continuation bytes than its lead byte announces (invalid UTF-8) is a
 * ValueError, as the Arrow kernels' Invalid UTF8 is: copied, the run would hand out raw bytes past the kept ones.
 *
 * The caller (string_masks.py) allocates the output: a data buffer as long as the input's values span (the output
 * is never longer: one byte per masked code point, the original bytes per kept one) and length + 1 offsets of the
 * input's width. Every input offset is checked against its buffers before a byte is read, so a malformed array is
 * a ValueError, never a read outside a buffer. The loops run without the GIL: scans mask on several threads.
 *
 * Three paths: ASCII-only data is masked 16 bytes at a time (SSE2) and keeps its offsets; text with multi-byte code
 * points is compacted 16 bytes at a time with SSSE3 shuffles where the CPU has them (checked at import), each
 * value's bounds read off a bitmap of continuation bytes; else each value is walked. The tests run all three.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static unsigned char mask_table[256]; /* filled by the module's init from mask_byte */

static unsigned char mask_byte(unsigned char byte) {
    unsigned char digit = (unsigned char)(byte - '0') <= 9;
    unsigned char kept = byte == '(' || byte == ')' || byte == ',' || byte == '.' || byte == '-' || byte == '@';
    return digit ? 'n' : (kept ? byte : 'x');
}

#if defined(__SSE2__)
/* mask_byte on 16 bytes (gcc does not vectorise the compares itself) */
static inline __m128i mask16(__m128i b) {
    const __m128i top = _mm_set1_epi8((char)0x80), zero = _mm_set1_epi8('0'), ten = _mm_set1_epi8((char)(10 ^ 0x80));
    /* unsigned b - '0' < 10, as a signed compare with the top bits flipped */
    __m128i digit = _mm_cmplt_epi8(_mm_xor_si128(_mm_sub_epi8(b, zero), top), ten);
    __m128i brackets = _mm_or_si128(_mm_cmpeq_epi8(b, _mm_set1_epi8('(')), _mm_cmpeq_epi8(b, _mm_set1_epi8(')')));
    __m128i marks = _mm_or_si128(_mm_cmpeq_epi8(b, _mm_set1_epi8(',')), _mm_cmpeq_epi8(b, _mm_set1_epi8('.')));
    __m128i others = _mm_or_si128(_mm_cmpeq_epi8(b, _mm_set1_epi8('-')), _mm_cmpeq_epi8(b, _mm_set1_epi8('@')));
    __m128i kept = _mm_or_si128(brackets, _mm_or_si128(marks, others));
    __m128i result = _mm_or_si128(_mm_and_si128(kept, b), _mm_andnot_si128(kept, _mm_set1_epi8('x')));
    return _mm_or_si128(_mm_and_si128(digit, _mm_set1_epi8('n')), _mm_andnot_si128(digit, result));
}
#endif

/* mask_byte over a span, 16 bytes at a time where SSE2 is there. */
static void mask_span(const unsigned char *in, unsigned char *out, Py_ssize_t size) {
    Py_ssize_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= size; i += 16) {
        _mm_storeu_si128((__m128i *)(out + i), mask16(_mm_loadu_si128((const __m128i *)(in + i))));
    }
#endif
    for (; i < size; i++) {
        out[i] = mask_table[in[i]];
    }
}

static int is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

typedef struct {
    const unsigned char *data;
    const unsigned char *offsets; /* the input's offsets buffer, from its first used entry */
    const unsigned char *validity; /* NULL when every slot is valid */
    Py_ssize_t validity_bit;      /* bit of the first slot in `validity` */
    int width;                    /* 4 (string) or 8 (large_string) */
    Py_ssize_t length;
    Py_ssize_t keep_first;
    Py_ssize_t keep_last;
    unsigned char *out;
    unsigned char *out_offsets;
    Py_ssize_t data_size; /* the whole data buffer's, for reads of 16 bytes */
    Py_ssize_t out_size;
} Masking;

static int64_t offset_at(const unsigned char *offsets, int width, Py_ssize_t index) {
    if (width == 4) {
        int32_t value;
        memcpy(&value, offsets + (size_t)index * 4, 4);
        return value;
    }
    int64_t value;
    memcpy(&value, offsets + (size_t)index * 8, 8);
    return value;
}

static void set_offset(unsigned char *offsets, int width, Py_ssize_t index, int64_t value) {
    if (width == 4) {
        int32_t narrow = (int32_t)value;
        memcpy(offsets + (size_t)index * 4, &narrow, 4);
    } else {
        memcpy(offsets + (size_t)index * 8, &value, 8);
    }
}

static int is_valid(const Masking *m, Py_ssize_t index) {
    if (m->validity == NULL) {
        return 1;
    }
    Py_ssize_t bit = m->validity_bit + index;
    return (m->validity[bit >> 3] >> (bit & 7)) & 1;
}

/* 0 when the offsets rise from at least 0 to at most data_size, -1 otherwise. */
static int check_offsets(const Masking *m, Py_ssize_t data_size) {
    int64_t previous = offset_at(m->offsets, m->width, 0);
    if (previous < 0) {
        return -1;
    }
    for (Py_ssize_t i = 1; i <= m->length; i++) {
        int64_t next = offset_at(m->offsets, m->width, i);
        if (next < previous) {
            return -1;
        }
        previous = next;
    }
    return previous <= data_size ? 0 : -1;
}

static int all_ascii(const unsigned char *bytes, Py_ssize_t size) {
    unsigned char seen = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        seen |= bytes[i];
    }
    return seen < 0x80;
}

/* The first `keep` bytes of an ASCII value (a byte a code point), at most `size`; 4 as one 4-byte move. */
static void copy_kept(unsigned char *out, const unsigned char *in, int64_t size, Py_ssize_t keep) {
    if (size >= 4 && keep == 4) {
        memcpy(out, in, 4); /* the usual case, as one 4-byte move */
        return;
    }
    for (int64_t i = 0; i < size && i < keep; i++) {
        out[i] = in[i];
    }
}

/* ASCII only: one output byte per input byte, so the offsets only move to start at 0. */
static Py_ssize_t mask_ascii(const Masking *m, int64_t start, int64_t end) {
    const unsigned char *in = m->data + start;
    Py_ssize_t size = (Py_ssize_t)(end - start);
    mask_span(in, m->out, size);
    for (Py_ssize_t i = 0; i <= m->length; i++) {
        set_offset(m->out_offsets, m->width, i, offset_at(m->offsets, m->width, i) - start);
    }
    if (m->keep_first == 0 && m->keep_last == 0) {
        return size;
    }
    for (Py_ssize_t i = 0; i < m->length; i++) {
        if (!is_valid(m, i)) {
            continue;
        }
        int64_t value_start = offset_at(m->offsets, m->width, i) - start;
        int64_t value_size = offset_at(m->offsets, m->width, i + 1) - start - value_start;
        if (m->keep_first > 0) {
            copy_kept(m->out + value_start, in + value_start, value_size, m->keep_first);
        }
        if (m->keep_last > 0) {
            int64_t last = value_size < m->keep_last ? value_size : m->keep_last;
            int64_t from = value_start + value_size - last;
            copy_kept(m->out + from, in + from, last, m->keep_last);
        }
    }
    return size;
}

/* The masked bytes of `in`: one per code point, continuation bytes dropped. Returns the bytes written, never more
 * than `size`. Every byte is written but only a code point's first byte moves on, so the loop has no branch; a
 * dropped byte's write is overwritten by the next one and never lands past the bytes read so far. */
static inline Py_ssize_t mask_compress(const unsigned char *in, Py_ssize_t size, unsigned char *out) {
    Py_ssize_t i = 0, written = 0;
#if defined(__SSE2__)
    for (; i + 16 <= size; i += 16) {
        if (_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(in + i))) == 0) {
            mask_span(in + i, out + written, 16); /* an ASCII chunk: a byte each */
            written += 16;
            continue;
        }
        for (Py_ssize_t j = i; j < i + 16; j++) {
            out[written] = mask_table[in[j]];
            written += !is_continuation(in[j]);
        }
    }
#endif
    for (; i < size; i++) {
        out[written] = mask_table[in[i]];
        written += !is_continuation(in[i]);
    }
    return written;
}

static inline int64_t copy_bytes(unsigned char *out, const unsigned char *in, int64_t size) {
    for (int64_t i = 0; i < size; i++) { /* a few bytes at most: a call to memcpy costs more */
        out[i] = in[i];
    }
    return size;
}

/* Where the kept prefix of a value ends: after its first `keep` code points (the value's end if it has fewer). */
static int64_t prefix_end(const unsigned char *in, int64_t size, int64_t from, Py_ssize_t keep) {
    int64_t b = from;
    for (Py_ssize_t seen = 0; b < size; b++) {
        if (!is_continuation(in[b]) && seen++ == keep) {
            break;
        }
    }
    return b;
}

/* Where the kept suffix of a value starts: at its `keep`-th code point from the end (`from` if it has fewer). */
static int64_t suffix_start(const unsigned char *in, int64_t size, int64_t from, Py_ssize_t keep) {
    int64_t b = size;
    for (Py_ssize_t seen = 0; seen < keep && b > from;) {
        b--;
        seen += !is_continuation(in[b]);
    }
    return b;
}

/* How many continuation bytes a lead byte announces (UTF-8's longest form is a lead and 3). */
static int continuations_announced(unsigned char lead) {
    return lead >= 0xF8 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
}

/* 1 when every kept code point in [from, to) is a lead byte and at most the continuation bytes it announces.
 * Invalid UTF-8 can hang any number of continuation bytes (6 raw bits each) on a kept code point, which the
 * copy would hand out raw; the Arrow kernels refuse such input too (utf8_slice_codeunits: Invalid UTF8). */
static int kept_code_points_bounded(const unsigned char *in, int64_t from, int64_t to) {
    int left = 0; /* a continuation byte with no lead before it in the span is refused as well */
    for (int64_t b = from; b < to; b++) {
        if (!is_continuation(in[b])) {
            left = continuations_announced(in[b]);
        } else if (left-- == 0) {
            return 0;
        }
    }
    return 1;
}

#define INVALID_KEPT_UTF8 (-3) /* mask_multibyte's return when kept_code_points_bounded refused a value */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <tmmintrin.h>
#define HAVE_COMPACTING 1

/* Whether this CPU has SSSE3 and POPCNT (set at module init); tests turn it off to check the per-value path. */
static int compacting_enabled;
static unsigned char packed_positions[256][8]; /* for each 8-bit mask of kept bytes: their positions, packed */
static unsigned char kept_count[256];

static void fill_compacting_tables(void) {
    for (int kept = 0; kept < 256; kept++) {
        int count = 0;
        for (int bit = 0; bit < 8; bit++) {
            if (kept & (1 << bit)) {
                packed_positions[kept][count++] = (unsigned char)bit;
            }
        }
        kept_count[kept] = (unsigned char)count;
        for (int rest = count; rest < 8; rest++) {
            packed_positions[kept][rest] = 0x80; /* pshufb writes a zero, overwritten by the next store */
        }
    }
}

/* Whether the continuation byte at `at` is announced (unannounced16's rule, one byte at a time). */
static int announced_at(const unsigned char *in, int64_t at) {
    for (int64_t back = 1; back <= 3 && back <= at; back++) {
        if (!is_continuation(in[at - back])) {
            return continuations_announced(in[at - back]) >= back;
        }
    }
    return 0;
}

/* The continuation bytes of a span, one bit each in words of 64 bytes, and how many come before each word. */
typedef struct {
    uint64_t *bits;
    int64_t *before;
    int unannounced; /* some continuation byte is more than its lead announced (or has none): see unannounced16 */
} Continuations;

/* The continuation bytes of 16 that their code point's lead did not announce (0xFF each), `previous` being the 16
 * bytes before (zeros at the span's start). A continuation byte is announced when the nearest lead before it is at
 * most as far as the continuation bytes it announces (1 for 0xC0-0xDF, 2 for 0xE0-0xEF, 3 for 0xF0-0xF7), every
 * byte between being a continuation one. Valid UTF-8 has none; kept code points are checked one by one only when
 * a span has some (kept_code_points_bounded). */
static inline __m128i continuations16(__m128i x) {
    return _mm_cmpeq_epi8(_mm_and_si128(x, _mm_set1_epi8((char)0xC0)), _mm_set1_epi8((char)0x80));
}

/* The bytes of x above `floor` and below 0xF8: with floor 0xBF, 0xDF, 0xEF the leads announcing 1, 2, 3 or more.
 * Unsigned compares by saturating subtraction: x > c exactly when x - c (saturated at 0) is not 0. */
static inline __m128i leads_above(__m128i x, unsigned char floor) {
    const __m128i zero = _mm_setzero_si128();
    __m128i below_f8 = _mm_cmpeq_epi8(_mm_subs_epu8(x, _mm_set1_epi8((char)0xF7)), zero);
    return _mm_andnot_si128(_mm_cmpeq_epi8(_mm_subs_epu8(x, _mm_set1_epi8((char)floor)), zero), below_f8);
}

__attribute__((target("ssse3"))) static inline __m128i unannounced16(__m128i b, __m128i previous) {
    __m128i continuation = continuations16(b), previous_continuation = continuations16(previous);
    /* each shifted by k bytes: byte p sees byte p - k (of `previous` below p = k) */
    __m128i lead_1_back = _mm_alignr_epi8(leads_above(b, 0xBF), leads_above(previous, 0xBF), 15);
    __m128i lead_2_back = _mm_alignr_epi8(leads_above(b, 0xDF), leads_above(previous, 0xDF), 14);
    __m128i lead_3_back = _mm_alignr_epi8(leads_above(b, 0xEF), leads_above(previous, 0xEF), 13);
    __m128i continuation_1_back = _mm_alignr_epi8(continuation, previous_continuation, 15);
    __m128i continuation_2_back = _mm_alignr_epi8(continuation, previous_continuation, 14);
    __m128i announced = _mm_or_si128(
        lead_1_back,
        _mm_and_si128(continuation_1_back,
                      _mm_or_si128(lead_2_back, _mm_and_si128(continuation_2_back, lead_3_back))));
    return _mm_andnot_si128(announced, continuation);
}

/* Every code point of a span masked to one byte, 16 bytes at a time: mask16 masks them all, then each half's code
 * point starts are packed to the front with pshufb and stored 8 bytes at a time (the next store overwrites what
 * is past the kept ones; no store reaches past the bytes read so far). Returns the bytes written to `target`. */
__attribute__((target("ssse3,popcnt"))) static Py_ssize_t compact_span(const unsigned char *in, Py_ssize_t size,
                                                                        unsigned char *target, Continuations *found,
                                                                        int check_announced) {
    const __m128i upper_half = _mm_set1_epi8(8);
    Py_ssize_t i = 0, written = 0;
    int64_t dropped = 0;
    __m128i previous = _mm_setzero_si128(), unannounced = _mm_setzero_si128();
    for (; i + 16 <= size; i += 16) {
        if ((i & 63) == 0) {
            found->before[i >> 6] = dropped;
        }
        __m128i b = _mm_loadu_si128((const __m128i *)(in + i));
        if (check_announced) { /* only kept code points are copied raw; mask-alphanum keeps none */
            unannounced = _mm_or_si128(unannounced, unannounced16(b, previous));
            previous = b;
        }
        unsigned dropped_bits = (unsigned)_mm_movemask_epi8(continuations16(b));
        found->bits[i >> 6] |= (uint64_t)dropped_bits << (i & 63);
        dropped += __builtin_popcount(dropped_bits);
        __m128i masked = mask16(b);
        unsigned kept_low = ~dropped_bits & 0xFF, kept_high = (~dropped_bits >> 8) & 0xFF;
        __m128i low = _mm_loadl_epi64((const __m128i *)packed_positions[kept_low]);
        __m128i high = _mm_add_epi8(_mm_loadl_epi64((const __m128i *)packed_positions[kept_high]), upper_half);
        _mm_storel_epi64((__m128i *)(target + written), _mm_shuffle_epi8(masked, low));
        written += kept_count[kept_low];
        _mm_storel_epi64((__m128i *)(target + written), _mm_shuffle_epi8(masked, high));
        written += kept_count[kept_high];
    }
    for (; i < size; i++) {
        if ((i & 63) == 0) {
            found->before[i >> 6] = dropped;
        }
        int dropped_byte = is_continuation(in[i]);
        found->unannounced |= check_announced && dropped_byte && !announced_at(in, i);
        found->bits[i >> 6] |= (uint64_t)dropped_byte << (i & 63);
        dropped += dropped_byte;
        target[written] = mask_table[in[i]];
        written += !dropped_byte;
    }
    if ((size & 63) == 0) {
        found->before[size >> 6] = dropped; /* the end's own word, when the span fills its last word exactly */
    }
    found->unannounced |= _mm_movemask_epi8(unannounced) != 0;
    return written;
}

/* Where the compacted text has the code point at byte `at` of the span: the bytes before it that are not
 * continuation bytes. */
__attribute__((target("popcnt"))) static inline int64_t compacted_at(const Continuations *found, int64_t at) {
    uint64_t below = found->bits[at >> 6] & ((1ULL << (at & 63)) - 1);
    return at - found->before[at >> 6] - __builtin_popcountll(below);
}

/* The lead (not continuation) bytes among the 64 bytes of the span from `at`, bit 0 for byte `at`. Bytes past the
 * span's end read as leads (the bitmap has a zero word after the last); callers mask to the value. */
static inline uint64_t leads_from(const Continuations *found, int64_t at) {
    int64_t word = at >> 6, shift = at & 63;
    uint64_t bits = found->bits[word] >> shift;
    if (shift != 0) {
        bits |= found->bits[word + 1] << (64 - shift);
    }
    return ~bits;
}

/* The leads among bytes [from, end) of a value, as at most the 64 bytes before `end`: bit 63 for byte end - 1. */
static inline uint64_t leads_before(const Continuations *found, int64_t from, int64_t end) {
    int64_t window = end - from < 64 ? end - from : 64;
    if (window == 0) {
        return 0;
    }
    return leads_from(found, end - window) << (64 - window);
}

/* A run of at most 16 bytes as one 16-byte move where both sides have the room (the bytes past the run land where
 * the next run goes, or past the end, which is cleared), else memcpy. */
static inline void copy_run(unsigned char *to, const unsigned char *to_end, const unsigned char *from,
                            const unsigned char *from_end, int64_t size) {
    if (size <= 16 && to_end - to >= 16 && from_end - from >= 16) {
        _mm_storeu_si128((__m128i *)to, _mm_loadu_si128((const __m128i *)from));
    } else if (size > 0) {
        memcpy(to, from, (size_t)size);
    }
}

/* The bounds of a value's masked part, from the leads bitmap instead of a walk: the kept prefix ends at the lead
 * after its first `keep_first` code points, the kept suffix starts at the `keep_last`-th lead from the end (both
 * within 64 bytes of valid UTF-8: at most 15 code points of 4 bytes are kept; runs of continuation bytes that push
 * them out are walked instead). Continuation bytes before the first lead are skipped. Null slots keep nothing. */
__attribute__((target("popcnt"))) static inline void masked_part(const Masking *m, const Continuations *found,
                                                                 const unsigned char *in, Py_ssize_t v,
                                                                 int64_t start, int64_t end, int64_t *first,
                                                                 int64_t *middle, int64_t *last) {
    uint64_t in_value = end - start >= 64 ? ~0ULL : (1ULL << (end - start)) - 1;
    uint64_t leads = leads_from(found, start) & in_value;
    *first = leads ? start + __builtin_ctzll(leads) : end;
    if (!leads && end - start > 64) { /* 64 or more leading continuation bytes (invalid UTF-8) hide the first lead */
        for (*first = start; *first < end && is_continuation(in[*first]);) {
            ++*first;
        }
    }
    *middle = *first;
    *last = end;
    if (!is_valid(m, v)) {
        return;
    }
    if (m->keep_first > 0) {
        uint64_t after = leads_from(found, *first) & (end - *first >= 64 ? ~0ULL : (1ULL << (end - *first)) - 1);
        for (Py_ssize_t k = 0; k < m->keep_first; k++) {
            after &= after - 1;
        }
        if (after) {
            *middle = *first + __builtin_ctzll(after);
        } else if (end - *first <= 64) {
            *middle = end; /* the value has no more code points than are kept */
        } else { /* runs of continuation bytes (invalid UTF-8) pushed the prefix's end out of the window */
            *middle = prefix_end(in, end, *first, m->keep_first);
        }
    }
    if (m->keep_last > 0) {
        uint64_t tail = leads_before(found, *middle, end);
        for (Py_ssize_t k = 1; k < m->keep_last && tail; k++) {
            tail &= ~(1ULL << (63 - __builtin_clzll(tail)));
        }
        if (tail) {
            *last = end - 1 - __builtin_clzll(tail);
        } else if (end - *middle <= 64) {
            *last = *middle;
        } else {
            *last = suffix_start(in, end, *middle, m->keep_last);
        }
    }
}

/* The masks of a span with multi-byte code points, on a CPU with SSSE3. The whole span is compacted once (into the
 * output for mask-alphanum, else into a scratch buffer), each value's output offset comes from the continuation
 * bitmap and its kept prefix and suffix from the leads around its ends, so no value is walked byte by byte.
 * Returns the bytes written, -2 when memory ran out, or INVALID_KEPT_UTF8. */
__attribute__((target("ssse3,popcnt"))) static Py_ssize_t mask_compacting(const Masking *m, int64_t start,
                                                                           int64_t end) {
    const unsigned char *in = m->data + start;
    Py_ssize_t size = (Py_ssize_t)(end - start), words = size / 64 + 2; /* a zero word after the last */
    int keeps = m->keep_first > 0 || m->keep_last > 0;
    Continuations found = {PyMem_RawCalloc((size_t)words, sizeof(uint64_t)),
                           PyMem_RawMalloc((size_t)words * sizeof(int64_t)), 0};
    unsigned char *compacted = keeps ? PyMem_RawMalloc((size_t)size + 1) : m->out;
    Py_ssize_t written = -2;
    if (found.bits == NULL || found.before == NULL || compacted == NULL) {
        goto done;
    }
    written = compact_span(in, size, compacted, &found, keeps);
    if (!keeps) {
        for (Py_ssize_t v = 0; v <= m->length; v++) {
            set_offset(m->out_offsets, m->width, v, compacted_at(&found, offset_at(m->offsets, m->width, v) - start));
        }
        goto done;
    }
    const unsigned char *in_end = m->data + m->data_size, *compacted_end = compacted + written;
    unsigned char *out_end = m->out + m->out_size;
    written = 0;
    set_offset(m->out_offsets, m->width, 0, 0);
    int64_t value_start = 0;
    for (Py_ssize_t v = 0; v < m->length; v++) {
        int64_t value_end = offset_at(m->offsets, m->width, v + 1) - start, first, middle, last;
        masked_part(m, &found, in, v, value_start, value_end, &first, &middle, &last);
        if (found.unannounced &&
            (!kept_code_points_bounded(in, first, middle) || !kept_code_points_bounded(in, last, value_end))) {
            written = INVALID_KEPT_UTF8; /* a null slot keeps nothing: both spans are empty */
            goto done;
        }
        int64_t hidden_from = compacted_at(&found, middle), hidden_to = compacted_at(&found, last);
        copy_run(m->out + written, out_end, in + first, in_end, middle - first);
        written += middle - first;
        copy_run(m->out + written, out_end, compacted + hidden_from, compacted_end, hidden_to - hidden_from);
        written += hidden_to - hidden_from;
        copy_run(m->out + written, out_end, in + last, in_end, value_end - last);
        written += value_end - last;
        set_offset(m->out_offsets, m->width, v + 1, written);
        value_start = value_end;
    }
    /* the 16-byte moves may have left original bytes past the end: never in the buffer handed on */
    memset(m->out + written, 0, (size_t)(m->out_size - written < 16 ? m->out_size - written : 16));
done:
    PyMem_RawFree(found.bits);
    PyMem_RawFree(found.before);
    if (keeps) {
        PyMem_RawFree(compacted);
    }
    return written;
}
#endif

/* Some multi-byte code points: each value is a kept prefix, a masked middle and a kept suffix, copied or masked
 * in turn; the offsets are rebuilt. Continuation bytes before a value's first code point belong to none. */
static Py_ssize_t mask_multibyte(const Masking *m, int64_t start, int64_t end) {
#if defined(HAVE_COMPACTING)
    if (compacting_enabled && m->keep_first < 16 && m->keep_last < 16) {
        return mask_compacting(m, start, end);
    }
#endif
    (void)start;
    (void)end;
    Py_ssize_t written = 0;
    set_offset(m->out_offsets, m->width, 0, 0);
    for (Py_ssize_t i = 0; i < m->length; i++) {
        int64_t value_start = offset_at(m->offsets, m->width, i);
        int64_t size = offset_at(m->offsets, m->width, i + 1) - value_start;
        const unsigned char *in = m->data + value_start;
        int64_t first = 0;
        while (first < size && is_continuation(in[first])) {
            first++;
        }
        int64_t middle = first, last = size; /* masked: [middle, last) */
        if (is_valid(m, i)) {
            middle = m->keep_first > 0 ? prefix_end(in, size, first, m->keep_first) : first;
            last = m->keep_last > 0 ? suffix_start(in, size, middle, m->keep_last) : size;
            if (!kept_code_points_bounded(in, first, middle) || !kept_code_points_bounded(in, last, size)) {
                return INVALID_KEPT_UTF8;
            }
        }
        written += copy_bytes(m->out + written, in + first, middle - first);
        written += mask_compress(in + middle, last - middle, m->out + written);
        written += copy_bytes(m->out + written, in + last, size - last);
        set_offset(m->out_offsets, m->width, i + 1, written);
    }
    return written;
}

static int take_buffer(PyObject *object, Py_buffer *view, int writable, const char *name) {
    if (object == Py_None) {
        view->buf = NULL;
        view->obj = NULL;
        view->len = 0;
        return 0;
    }
    if (PyObject_GetBuffer(object, view, writable ? (PyBUF_SIMPLE | PyBUF_WRITABLE) : PyBUF_SIMPLE) != 0) {
        PyErr_Format(PyExc_TypeError, "%s is not a%s buffer", name, writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static PyObject *mask_strings(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data_object, *offsets_object, *validity_object, *out_object, *out_offsets_object;
    int width;
    Py_ssize_t first, length, validity_bit, keep_first, keep_last;
    if (!PyArg_ParseTuple(args, "OOinnOnnnOO", &data_object, &offsets_object, &width, &first, &length,
                          &validity_object, &validity_bit, &keep_first, &keep_last, &out_object,
                          &out_offsets_object)) {
        return NULL;
    }
    if ((width != 4 && width != 8) || first < 0 || length < 0 || validity_bit < 0 || keep_first < 0 ||
        keep_last < 0 || first > PY_SSIZE_T_MAX - length - 1 || validity_bit > PY_SSIZE_T_MAX - length - 7) {
        PyErr_SetString(PyExc_ValueError, "mask_strings: a width of 4 or 8 and counts of at least 0");
        return NULL;
    }
    Py_buffer data = {0}, offsets = {0}, validity = {0}, out = {0}, out_offsets = {0};
    PyObject *result = NULL;
    if (take_buffer(data_object, &data, 0, "data") || take_buffer(offsets_object, &offsets, 0, "offsets") ||
        take_buffer(validity_object, &validity, 0, "validity") || take_buffer(out_object, &out, 1, "out") ||
        take_buffer(out_offsets_object, &out_offsets, 1, "out_offsets")) {
        goto done;
    }
    if (offsets.len / width < first + length + 1 || out_offsets.len / width < length + 1 ||
        (validity.buf != NULL && validity.len < (validity_bit + length + 7) / 8)) {
        PyErr_SetString(PyExc_ValueError, "string offsets or validity shorter than the array");
        goto done;
    }
    Masking m = {
        .data = data.buf,
        .offsets = (const unsigned char *)offsets.buf + (size_t)first * width,
        .validity = validity.buf,
        .validity_bit = validity_bit,
        .width = width,
        .length = length,
        .keep_first = keep_first,
        .keep_last = keep_last,
        .out = out.buf,
        .out_offsets = out_offsets.buf,
        .data_size = data.len,
        .out_size = out.len,
    };
    Py_ssize_t written = -1;
    int64_t start = 0, end = 0;
    Py_BEGIN_ALLOW_THREADS
    if (check_offsets(&m, data.len) == 0) {
        start = offset_at(m.offsets, width, 0);
        end = offset_at(m.offsets, width, length);
        if (end - start <= out.len) {
            int ascii = all_ascii(m.data + start, end - start);
            written = ascii ? mask_ascii(&m, start, end) : mask_multibyte(&m, start, end);
        }
    }
    Py_END_ALLOW_THREADS
    if (written == -2) {
        PyErr_NoMemory();
        goto done;
    }
    if (written == INVALID_KEPT_UTF8) {
        PyErr_SetString(PyExc_ValueError, "invalid UTF-8: a kept code point has more continuation bytes than its lead");
        goto done;
    }
    if (written < 0) {
        PyErr_SetString(PyExc_ValueError, "string offsets outside the data buffer, or the output is too short");
        goto done;
    }
    result = PyLong_FromSsize_t(written);
done:
    if (data.obj) PyBuffer_Release(&data);
    if (offsets.obj) PyBuffer_Release(&offsets);
    if (validity.obj) PyBuffer_Release(&validity);
    if (out.obj) PyBuffer_Release(&out);
    if (out_offsets.obj) PyBuffer_Release(&out_offsets);
    return result;
}

/* truncate-to-year/-month through a calendar table (temporal.py): each value's day, floored, indexes the table of
 * the floors of CALENDAR_DAYS days. One pass where the Arrow kernels take four (cast, subtract, min/max, take).
 * The divisor is a constant per unit, so the division is a multiply. Returns 0 when some value's day (a null
 * slot's too) is outside the table: the caller then takes its other paths. */
#define FLOOR_THROUGH_TABLE(NAME, T, PER_DAY)                                                                      \
    static int NAME(const unsigned char *values, Py_ssize_t length, const unsigned char *table,                \
                    Py_ssize_t table_length, int64_t table_first_day, unsigned char *out) {                     \
        for (Py_ssize_t i = 0; i < length; i++) {                                                                \
            T value;                                                                                             \
            memcpy(&value, values + (size_t)i * sizeof(T), sizeof(T));                                           \
            int64_t day = (int64_t)value / (PER_DAY);                                                            \
            day -= (int64_t)value % (PER_DAY) < 0; /* C divides toward zero; days are floored */                 \
            uint64_t index = (uint64_t)(day - table_first_day);                                                  \
            if (index >= (uint64_t)table_length) {                                                               \
                return 0;                                                                                        \
            }                                                                                                    \
            memcpy(out + (size_t)i * sizeof(T), table + index * sizeof(T), sizeof(T));                           \
        }                                                                                                        \
        return 1;                                                                                                \
    }

FLOOR_THROUGH_TABLE(floor_dates, int32_t, 1)
FLOOR_THROUGH_TABLE(floor_seconds, int64_t, INT64_C(86400))
FLOOR_THROUGH_TABLE(floor_millis, int64_t, INT64_C(86400000))
FLOOR_THROUGH_TABLE(floor_micros, int64_t, INT64_C(86400000000))
FLOOR_THROUGH_TABLE(floor_nanos, int64_t, INT64_C(86400000000000))

static PyObject *floor_through_table(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *values_object, *table_object, *out_object;
    Py_ssize_t first, length;
    long long per_day, table_first_day;
    if (!PyArg_ParseTuple(args, "OnnLOLO", &values_object, &first, &length, &per_day, &table_object,
                          &table_first_day, &out_object)) {
        return NULL;
    }
    int (*floor_values)(const unsigned char *, Py_ssize_t, const unsigned char *, Py_ssize_t, int64_t,
                        unsigned char *) = per_day == 1                    ? floor_dates
                                           : per_day == 86400LL            ? floor_seconds
                                           : per_day == 86400000LL         ? floor_millis
                                           : per_day == 86400000000LL      ? floor_micros
                                           : per_day == 86400000000000LL   ? floor_nanos
                                                                           : NULL;
    Py_ssize_t width = per_day == 1 ? 4 : 8;
    if (floor_values == NULL || first < 0 || length < 0 || first > PY_SSIZE_T_MAX / 8 - length) {
        PyErr_SetString(PyExc_ValueError, "floor_through_table: units of a day of 1 (dates) or 86400 s in s, ms, us "
                                          "or ns, and counts of at least 0");
        return NULL;
    }
    Py_buffer values = {0}, table = {0}, out = {0};
    PyObject *result = NULL;
    if (take_buffer(values_object, &values, 0, "values") || take_buffer(table_object, &table, 0, "table") ||
        take_buffer(out_object, &out, 1, "out")) {
        goto done;
    }
    if (values.len / width < first + length || out.len / width < length) {
        PyErr_SetString(PyExc_ValueError, "values or output shorter than the array");
        goto done;
    }
    int floored;
    Py_BEGIN_ALLOW_THREADS
    floored = floor_values((const unsigned char *)values.buf + first * width, length, table.buf, table.len / width,
                           (int64_t)table_first_day, out.buf);
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(floored);
done:
    if (values.obj) PyBuffer_Release(&values);
    if (table.obj) PyBuffer_Release(&table);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

#if defined(HAVE_COMPACTING)
static int cpu_can_compact(void) { return __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("popcnt"); }
#endif

/* For the tests: mask multi-byte text by the per-value walk (False) or, where the CPU can, the compacting path
 * (True). Returns whether the compacting path is now on. */
static PyObject *set_compacting(PyObject *self, PyObject *enabled) {
    (void)self;
    int wanted = PyObject_IsTrue(enabled);
    if (wanted < 0) {
        return NULL;
    }
#if defined(HAVE_COMPACTING)
    compacting_enabled = wanted && cpu_can_compact();
    return PyBool_FromLong(compacting_enabled);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"floor_through_table", floor_through_table, METH_VARARGS,
     "floor_through_table(values, first, length, per_day, table, table_first_day, out) -> whether every value's "
     "day was in the table"},
    {"set_compacting", set_compacting, METH_O, "set_compacting(enabled) -> whether the compacting path is on"},
    {"mask_strings", mask_strings, METH_VARARGS,
     "mask_strings(data, offsets, width, first, length, validity, validity_bit, keep_first, keep_last, out, "
     "out_offsets) -> bytes written to out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_masks", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__masks(void) {
    for (int byte = 0; byte < 256; byte++) {
        mask_table[byte] = mask_byte((unsigned char)byte);
    }
#if defined(HAVE_COMPACTING)
    fill_compacting_tables();
    compacting_enabled = cpu_can_compact();
#endif
    return PyModule_Create(&module);
}
