// exo's products for ggml's Q8_0, Q5_0 and Q6_K blocks, and Q4_K as ggml repacks it, on x86 with VNNI (AVX-512 VNNI
// or AVX-VNNI; repacked Q4_K with AVX-512 only).
//
// ggml's x86 build multiplies a few activation rows (a batched decode step: 2 to 16 sequences) by a Q8_0 or Q5_0
// matrix with llamafile's tinyBLAS, which spends about seven vector instructions on every 32 multiply-adds of one
// weight block with one row (and a Q6_K one by unpacking it into tiles each call). Two ways here instead, both with
// `vpdpbusd` (four unsigned bytes times four signed ones, summed into each 32-bit lane):
//
// - With AVX-512 (any rows, one to a prefill piece's): the outputs in the lanes. Sixteen outputs' blocks are loaded
//   and transposed so that each of eight registers holds one four-weight group of all sixteen, and each row's
//   matching four bytes are broadcast from memory by `vpdpbusd` itself: eight `vpdpbusd` a block a row plus its
//   scale, the loading, unpacking and transposing shared by every row (more than 16 rows: transposed once into a
//   panel). The next sixteen outputs' blocks are fetched into L2 in order meanwhile, which reads a matrix from
//   memory faster than ggml's one-row product does.
// - With AVX-VNNI only (5 to 8 rows): the rows in the lanes of one 256-bit register; for each four weights of a
//   block one `vpdpbusd` multiplies them (spread to every lane) with the same four positions of every row.
//
// `vpdpbusd` multiplies unsigned by signed bytes: the weights are taken plus 128 (Q8_0's top bit flipped; Q5_0's
// high bit blended in) and the rows, quantized as ggml quantizes them (Q8_0: a scale per 32 values, rounded to half
// precision), stay signed; each row's block sum × 128 (from its half-block sums, computed with the quantization) is
// subtracted. Q6_K's values are unsigned already (q, the value being q − 32): each group of 16 values' row sum × 32
// is subtracted, and its own scale applied. Its rows are quantized per 32 values as for the others (ggml's Q8_K
// quantizes them per 256), so its products round a little differently from ggml's, and closer to float32's.
//
// Q4_K held in ggml's interleaved layout (block_q4_Kx8, eight outputs a block: how llama.cpp and exo hold it for
// decode) is read as it lies, eight outputs in pairs of lanes (below, with AVX-512 only). Q6_K is packed at load
// into a layout of exo's own (BlockQ6Kx16, AVX-512 only), sixteen outputs' values a few instructions from the
// registers the outputs-in-lanes products use; as stored it is still taken (an embedding used as the output head).
//
// Called by ggml as a custom operation (ggml_custom_4d, every thread of its pool): dst = W · X, W (out × in) in
// Q8_0, Q5_0 or Q6_K as stored or Q4_K repacked, X float32 (rows × in), dst float32 (rows × out), as ggml_mul_mat
// lays them out. Each thread quantizes the rows itself and computes its own share of the outputs.

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "ggml.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define EXO_ROWS_KERNEL 1
#define EXO_ROWS_MAX 16
#elif defined(__AVXVNNI__) && defined(__AVX2__) && defined(__F16C__)
#define EXO_ROWS_KERNEL 1
#define EXO_ROWS_MAX 8
#else
#define EXO_ROWS_KERNEL 0
#define EXO_ROWS_MAX 0
#endif

extern "C" {
// The register's lanes: 16 with AVX-512 VNNI, 8 with AVX-VNNI (0: no kernel for this CPU; ggml_mul_mat serves).
int exo_rows_max(void) { return EXO_ROWS_MAX; }
// The fewest rows worth a product of this ggml type here, its rows of `in_features` values (0: the type is not
// taken), from the kernel bench (`python -m bench.quant_kernels`) and matrices streamed from memory: with AVX-512 one
// for Q8_0, Q5_0 (whose products read a matrix from memory faster than ggml's) and Q4_K as ggml repacks it
// (block_q4_Kx8: the caller passes no Q4_K matrix as stored); for Q6_K, whose unpacking shared by fewer rows costs
// more than ggml's product, 2 where its rows are short (up to 2,048 values: ggml's product of an output head of
// 151,936 × 1,536 over two rows took 1.4× exo's) and 3 where longer (8,960 values: 0.93× at 2 rows, 1.1× at 3). 5 for
// all but Q4_K with AVX-VNNI only.
int exo_rows_min(int type, int64_t in_features);
// The most rows it takes a product of this type for: with AVX-512 any number for Q8_0, Q5_0 and repacked Q4_K, and
// 128 for Q6_K; the lanes (8) with AVX-VNNI only.
int exo_rows_most(int type);
void exo_rows_mul_mat(struct ggml_tensor* dst, int ith, int nth, void* userdata);
// Q6_K packed in exo's own layout (below: sixteen outputs' values already in the lanes), with AVX-512 only. Whether
// a matrix of `out` × `in` values can be held so here (1) or not (0: no AVX-512 VNNI, or not whole groups of 16
// outputs and 256 values).
int exo_q6k_packs(int64_t out, int64_t in);
// `stored` (out rows of Q6_K blocks, as a GGUF holds them) into `packed` (as many bytes), and back: exactly the same
// values, scales and d. Return 0, or -1 where `exo_q6k_packs` says no.
int exo_q6k_pack(const void* stored, void* packed, int64_t out, int64_t in);
int exo_q6k_unpack(const void* packed, void* stored, int64_t out, int64_t in);
// dst = W · X as `exo_rows_mul_mat`, W a Q6_K tensor whose bytes `exo_q6k_pack` wrote; any number of rows.
void exo_rows_mul_mat_packed_q6k(struct ggml_tensor* dst, int ith, int nth, void* userdata);
}

#if EXO_ROWS_KERNEL

namespace {

constexpr int kBlock = 32;  // values in a Q8_0 or Q5_0 block
constexpr int kQuads = kBlock / 4;

struct BlockQ8 {
    uint16_t d;
    int8_t qs[kBlock];
};
struct BlockQ5 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[kBlock / 2];
};
// Q6_K: 256 values a block, in 16 groups of 16 each with its own 8-bit scale; value = d · scale · (q − 32), q the
// 6 bits: 4 in ql, 2 in qh (ggml's dequantize_row_q6_K spells out where).
constexpr int kSuper = 256;
struct BlockQ6K {
    uint8_t ql[kSuper / 2];
    uint8_t qh[kSuper / 4];
    int8_t scales[kSuper / 16];
    uint16_t d;
};
static_assert(sizeof(BlockQ6K) == 210, "Q6_K block");
// Q4_K as ggml's CPU_REPACK buffer holds it on x86 (block_q4_Kx8 in ggml-cpu/repack.h): one 256-value super-block of
// eight outputs side by side. Output j's value = d[j] · scale · q − dmin[j] · min, q a nibble, each 32 values
// (a sub-block) with a 6-bit scale and min. qs: 16 chunks of 64 bytes, chunk c holding bytes 8(c % 4) .. + 7 of
// sub-block pair c / 4 for each output in turn (8 bytes an output; a byte's low nibble is a value of the pair's first
// sub-block, its high nibble the same position's of the second). scales: 12 bytes a sub-block for all eight
// outputs (ggml's make_block_q4_Kx8 packs them).
struct BlockQ4Kx8 {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t scales[96];
    uint8_t qs[1024];
};
static_assert(sizeof(BlockQ4Kx8) == 1152, "block_q4_Kx8");
static_assert(sizeof(BlockQ8) == 34, "Q8_0 block");
static_assert(sizeof(BlockQ5) == 22, "Q5_0 block");

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

// The rows quantized, laid out for the lanes: quads[(block * 8 + quad) * lanes + lane] holds the four signed bytes
// of one row's positions block * 32 + quad * 4 .. + 3; scales[block * lanes + lane] that row's block scale and
// half_sums[(block * 2 + half) * lanes + lane] the sum of its 16 values of that half (what the weights' offsets add:
// Q8_0's and Q5_0's +128 over both halves, Q6_K's 32 over each of its 16-value groups). Spare lanes are zero.
struct QuantizedRows {
    uint32_t* quads = nullptr;
    float* scales = nullptr;
    int32_t* half_sums = nullptr;
    size_t capacity = 0;  // bytes held

    void reserve(size_t blocks, int lanes) {
        size_t need = blocks * kQuads * lanes * sizeof(uint32_t) + 3 * blocks * lanes * sizeof(float);
        if (need <= capacity) return;
        free(quads);
        quads = static_cast<uint32_t*>(aligned_alloc(64, (need + 63) / 64 * 64));
        scales = reinterpret_cast<float*>(quads + blocks * kQuads * lanes);
        half_sums = reinterpret_cast<int32_t*>(scales + blocks * lanes);
        capacity = need;
    }
};

thread_local QuantizedRows t_rows;

// ggml's own quantization of an activation row to Q8_0 (quantize_row_q8_0 on x86): scale amax / 127 kept in half
// precision, values x · 127 / amax rounded to nearest even.
void quantize_rows(const char* x, size_t row_stride, int rows, int64_t blocks, int lanes, QuantizedRows& out) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    for (int lane = 0; lane < lanes; ++lane) {
        for (int64_t b = 0; b < blocks; ++b) {
            uint32_t* quads = out.quads + b * kQuads * lanes + lane;
            if (lane >= rows) {
                for (int q = 0; q < kQuads; ++q) quads[q * lanes] = 0;
                out.scales[b * lanes + lane] = 0.0f;
                out.half_sums[(b * 2) * lanes + lane] = out.half_sums[(b * 2 + 1) * lanes + lane] = 0;
                continue;
            }
            const float* v = reinterpret_cast<const float*>(x + lane * row_stride) + b * kBlock;
            __m256 m = _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(v));
            for (int i = 8; i < kBlock; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(v + i)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4);
            out.scales[b * lanes + lane] = half_to_float(float_to_half(amax / 127.0f));
            const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
            int32_t halves[2] = {0, 0};
            for (int i = 0; i < kBlock; i += 8) {
                alignas(32) int32_t values[8];
                _mm256_store_si256(reinterpret_cast<__m256i*>(values), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), id)));
                for (int j = 0; j < 8; j += 4) {
                    quads[((i + j) / 4) * lanes] = uint32_t(uint8_t(values[j])) | uint32_t(uint8_t(values[j + 1])) << 8 |
                                                   uint32_t(uint8_t(values[j + 2])) << 16 |
                                                   uint32_t(uint8_t(values[j + 3])) << 24;
                }
                for (int j = 0; j < 8; ++j) halves[i / 16] += values[j];
            }
            out.half_sums[(b * 2) * lanes + lane] = halves[0];
            out.half_sums[(b * 2 + 1) * lanes + lane] = halves[1];
        }
    }
}

// A Q5_0 block's 32 values as signed bytes (-16..15), as ggml's AVX2 code unpacks them.
inline __m256i unpack_q5(const BlockQ5& block) {
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs));
    __m256i values = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), _mm256_set1_epi8(0x0F));
    uint32_t high;
    memcpy(&high, block.qh, sizeof(high));
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(int(high)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i bits = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                           _mm256_set1_epi64x(-1));
    return _mm256_or_si256(values, _mm256_andnot_si256(bits, _mm256_set1_epi8(char(0xF0))));
}

// A Q5_0 block's 32 values plus 128, as unsigned bytes: value v = nibble + 16 · high bit − 16, so v + 128 is the
// nibble with 0x80 (high bit set) or 0x70 (clear) in its top half. With AVX-512BW the 32 high bits are the blend's
// mask as they are stored (bit j for value j).
inline __m256i unpack_q5_unsigned(const BlockQ5& block) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs));
    const __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), _mm256_set1_epi8(0x0F));
    uint32_t high;
    memcpy(&high, block.qh, sizeof(high));
    return _mm256_or_si256(low, _mm256_mask_blend_epi8(__mmask32(high), _mm256_set1_epi8(0x70), _mm256_set1_epi8(char(0x80))));
#else
    return _mm256_xor_si256(unpack_q5(block), _mm256_set1_epi8(char(0x80)));
#endif
}

// The 32 values `part` (0..7) of a Q6_K block, as unsigned bytes q (0..63; the value is q − 32).
inline __m256i unpack_q6k(const BlockQ6K& block, int part) {
    const int chunk = part / 4, which = part % 4;  // 128 values a chunk: ql's 64 bytes, qh's 32
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.ql + chunk * 64 + (which & 1) * 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh + chunk * 32));
    const __m256i low = which < 2 ? ql : _mm256_srli_epi16(ql, 4);
    __m256i high;  // bits 2·which .. 2·which + 1 of qh, moved to bits 4..5
    switch (which) {
        case 0: high = _mm256_slli_epi16(qh, 4); break;
        case 1: high = _mm256_slli_epi16(qh, 2); break;
        case 2: high = qh; break;
        default: high = _mm256_srli_epi16(qh, 2); break;
    }
    return _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi8(0x0F)), _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
}

// One register of lanes: 256-bit (8 lanes) or, with AVX-512, 512-bit (16).
struct Lanes8 {
    static constexpr int kLanes = 8;
    using I = __m256i;
    using F = __m256;
    static I zero() { return _mm256_setzero_si256(); }
    static F fzero() { return _mm256_setzero_ps(); }
    static I load(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
    static F loadf(const float* p) { return _mm256_load_ps(p); }
    // The block's four weights `quad` (bytes 4·quad .. +3) in every lane. A permutation from the register, not a
    // broadcast from a copy in memory: the copy's loads waited on its store (about 17% slower at 8 rows).
    static I spread(__m256i block, int quad) { return _mm256_permutevar8x32_epi32(block, _mm256_set1_epi32(quad)); }
    // acc + each lane's four row bytes times the four weights (unsigned) every lane of `weights` holds.
    static I dot(I acc, I rows, I weights) { return _mm256_dpbusd_avx_epi32(acc, weights, rows); }
    template <int bits>
    static I shift(I a) { return _mm256_slli_epi32(a, bits); }
    static I add(I a, I b) { return _mm256_add_epi32(a, b); }
    static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
    static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
    static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F set1(float v) { return _mm256_set1_ps(v); }
    static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};


// This thread's share of `out` outputs, in whole groups of `group`: [first, last), empty where there is none.
inline void outputs_share(int64_t out, int64_t group, int ith, int nth, int64_t& first, int64_t& last) {
    const int64_t groups = (out + group - 1) / group;
    const int64_t per_thread = (groups + nth - 1) / nth;
    first = ith * per_thread * group;
    last = first + per_thread * group;
    if (last > out) last = out;
}

// Eight output rows at a time share each load of the quantized rows, and their eight chains of `vpdpbusd` keep the
// unit busy (one chain waits on its own latency, about five cycles an instruction).
constexpr int kOutputsAtOnce = 8;

// What `products` needs of a block type: each 32 values of a row's blocks as unsigned bytes, the groups of them that
// share a scale (Q8_0 and Q5_0: 1, Q6_K: 2 of 16), a group's scale, and what to subtract from a group's sums.
template <typename Block>
struct Format;

// Q8_0 and Q5_0: one scale a block, the weights taken plus 128 (so 128 × the row's block sum is subtracted).
template <typename Block>
struct Format32 {
    static constexpr int kGroups = 1;
    static float scale(const Block* row, int64_t b, int /*group*/) { return half_to_float(row[b].d); }
    template <typename L>
    static typename L::I offset(const QuantizedRows& rows, int64_t b, int /*group*/) {
        const int32_t* halves = rows.half_sums + b * 2 * L::kLanes;
        return L::template shift<7>(L::add(L::load(halves), L::load(halves + L::kLanes)));
    }
};

template <>
struct Format<BlockQ8> : Format32<BlockQ8> {
    static __m256i values(const BlockQ8* row, int64_t b) {  // plus 128: the top bit flipped
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[b].qs)),
                                _mm256_set1_epi8(char(0x80)));
    }
};

template <>
struct Format<BlockQ5> : Format32<BlockQ5> {
    static __m256i values(const BlockQ5* row, int64_t b) { return unpack_q5_unsigned(row[b]); }
};

// Q6_K: each 32 values' two groups of 16 have their own scale, and the values are unsigned already (q, the value
// being q − 32: each group's row sum × 32 is subtracted).
template <>
struct Format<BlockQ6K> {
    static constexpr int kGroups = 2;
    static constexpr int kParts = kSuper / kBlock;
    static __m256i values(const BlockQ6K* row, int64_t b) { return unpack_q6k(row[b / kParts], int(b % kParts)); }
    static float scale(const BlockQ6K* row, int64_t b, int group) {
        const BlockQ6K& block = row[b / kParts];
        return half_to_float(block.d) * float(block.scales[(b % kParts) * 2 + group]);
    }
    template <typename L>
    static typename L::I offset(const QuantizedRows& rows, int64_t b, int group) {
        return L::template shift<5>(L::load(rows.half_sums + (b * 2 + group) * L::kLanes));
    }
};

template <typename L, typename Block>
void products(const char* weights, size_t weight_row_bytes, int64_t first, int64_t last, int64_t blocks,
              const QuantizedRows& rows, int row_count, char* dst, size_t dst_row_stride) {
    using F = Format<Block>;
    constexpr int lanes = L::kLanes;
    constexpr int quads_a_group = kQuads / F::kGroups;
    alignas(64) float sums[kOutputsAtOnce][lanes];
    for (int64_t o = first; o < last; o += kOutputsAtOnce) {
        const int outputs = int(last - o < kOutputsAtOnce ? last - o : kOutputsAtOnce);
        typename L::F total[kOutputsAtOnce];
        const Block* row_blocks[kOutputsAtOnce];
        for (int k = 0; k < kOutputsAtOnce; ++k) {
            total[k] = L::fzero();
            row_blocks[k] = reinterpret_cast<const Block*>(weights + (o + (k < outputs ? k : 0)) * weight_row_bytes);
        }
        for (int64_t b = 0; b < blocks; ++b) {
            const uint32_t* quads = rows.quads + b * kQuads * lanes;
            const typename L::F row_scales = L::loadf(rows.scales + b * lanes);
            __m256i block_values[kOutputsAtOnce];  // each output's 32 values, as unsigned bytes
            for (int k = 0; k < kOutputsAtOnce; ++k) block_values[k] = F::values(row_blocks[k], b);
            for (int group = 0; group < F::kGroups; ++group) {
                typename L::I acc[kOutputsAtOnce];
                for (int k = 0; k < kOutputsAtOnce; ++k) acc[k] = L::zero();
                for (int q = group * quads_a_group; q < (group + 1) * quads_a_group; ++q) {
                    const typename L::I x = L::load(quads + q * lanes);
                    for (int k = 0; k < kOutputsAtOnce; ++k) acc[k] = L::dot(acc[k], x, L::spread(block_values[k], q));
                }
                const typename L::I offset = F::template offset<L>(rows, b, group);
                for (int k = 0; k < kOutputsAtOnce; ++k) {
                    const float scale = F::scale(row_blocks[k], b, group);
                    total[k] = L::fmadd(L::cvt(L::sub(acc[k], offset)), L::mul(row_scales, L::set1(scale)), total[k]);
                }
            }
        }
        for (int k = 0; k < outputs; ++k) {
            L::store(sums[k], total[k]);
            for (int r = 0; r < row_count; ++r) {
                reinterpret_cast<float*>(dst + r * dst_row_stride)[o + k] = sums[k][r];
            }
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
// The outputs in the lanes instead (AVX-512; Q8_0, Q5_0 and Q6_K): 16 outputs' blocks are loaded and transposed so
// that each of eight registers holds one four-weight group of all 16, and each row's matching four bytes are
// broadcast from memory by `vpdpbusd` itself. A block then costs eight `vpdpbusd` a row plus its scale, and the
// loads, unpacking and transposition (about 40 instructions) are shared by every row: cheaper than the lanes-of-rows
// kernel above at any row count, where that one spends a permutation on every `vpdpbusd` and a full register however
// few the rows. The next 16 outputs' blocks are fetched into L2 in order while these are multiplied, which reads a
// matrix from memory faster than ggml's one-row product does (the default model's output head, 145 MB of Q8_0, in
// about 4 ms against ggml's 5 to 5.5 on the kernel bench).
constexpr int kOutputLanes = 16;

// Sixteen outputs' 32 values (plus 128) in, as pairs: halves[j] holds output j's (low 256 bits) and output j + 8's
// (high); out: quads[k] holds bytes 4k..4k+3 of output l in lane l. Three rounds of `vpermt2d`, each swapping one
// bit of the register's index with one of the lane's.
inline void transpose_quads(__m512i halves[kQuads]) {
    alignas(64) static const int32_t kLow[3][16] = {
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}};
    alignas(64) static const int32_t kHigh[3][16] = {
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}};
    for (int round = 0; round < 3; ++round) {
        const __m512i low = _mm512_load_si512(kLow[round]);
        const __m512i high = _mm512_load_si512(kHigh[round]);
        const int bit = 1 << round;
        for (int j = 0; j < kQuads; ++j) {
            if (j & bit) continue;
            const __m512i a = halves[j], b = halves[j | bit];
            halves[j] = _mm512_permutex2var_epi32(a, low, b);
            halves[j | bit] = _mm512_permutex2var_epi32(a, high, b);
        }
    }
}

// What the outputs-in-lanes products need of a block type, per 32 values ("part") b of a row: the values as
// unsigned bytes, how many groups of them share a scale (Q8_0, Q5_0: 1; Q6_K: 2 of 16), what the unsigned values
// add per value (128; Q6_K: 32), and the 16 outputs' scales of each group, gathered from the blocks at `at` (the
// first output's block holding part b) `index` bytes apart.
template <typename Block>
struct OutputsFormat;

// Q8_0 and Q5_0: a block a part, its half-precision scale d its first two bytes, the values taken plus 128.
template <typename Block>
struct OutputsFormat32 {
    static constexpr int kGroups = 1;
    static constexpr int kOffset = 128;
    static const Block* block_of(const char* row, int64_t b) { return reinterpret_cast<const Block*>(row) + b; }
    static const char* block(const char* row, int64_t b) { return reinterpret_cast<const char*>(block_of(row, b)); }
    static void scales(const char* at, __m512i index, int64_t /*b*/, __m512 out[1]) {
        out[0] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(index, at, 1)));
    }
};

template <>
struct OutputsFormat<BlockQ8> : OutputsFormat32<BlockQ8> {
    static __m256i values(const char* row, int64_t b) {  // plus 128: the top bit flipped
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_of(row, b)->qs)),
                                _mm256_set1_epi8(char(0x80)));
    }
};

template <>
struct OutputsFormat<BlockQ5> : OutputsFormat32<BlockQ5> {
    static __m256i values(const char* row, int64_t b) { return unpack_q5_unsigned(*block_of(row, b)); }
};

template <>
struct OutputsFormat<BlockQ6K> {
    static constexpr int kGroups = 2;
    static constexpr int kOffset = 32;
    static constexpr int kParts = kSuper / kBlock;
    static const char* block(const char* row, int64_t b) { return row + (b / kParts) * sizeof(BlockQ6K); }
    static __m256i values(const char* row, int64_t b) {
        return unpack_q6k(*reinterpret_cast<const BlockQ6K*>(block(row, b)), int(b % kParts));
    }
    static void scales(const char* at, __m512i index, int64_t b, __m512 out[2]) {
        // The four bytes from the part's two 8-bit scales hold them in their low half; the block's last four bytes
        // (scales 14 and 15, then d) its half-precision d in their high half: no gather reads past the block.
        const int part = int(b % kParts);
        const __m512i pair = _mm512_i32gather_epi32(index, at + offsetof(BlockQ6K, scales) + part * 2, 1);
        const __m512i tail = _mm512_i32gather_epi32(index, at + offsetof(BlockQ6K, d) - 2, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(tail, 16)));
        out[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(pair, 24), 24)));
        out[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 24)));
    }
};

// Where a group of 16 outputs' blocks is read from: the matrix's rows (clamped to the group's last output where the
// group is short), and each output's offset for gathering its blocks' scales.
struct Group {
    const char* row_of[kOutputLanes];
    __m512i gather_index;
    const char* ahead;  // the next group's first byte, fetched ahead while this one is read
    int64_t ahead_lines;
    int outputs;

    Group(const char* weights, size_t weight_row_bytes, int64_t o, int64_t last) {
        outputs = int(last - o < kOutputLanes ? last - o : kOutputLanes);
        for (int l = 0; l < kOutputLanes; ++l) row_of[l] = weights + (o + (l < outputs ? l : outputs - 1)) * weight_row_bytes;
        const __m512i strides = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(int(weight_row_bytes)));
        gather_index = _mm512_min_epi32(strides, _mm512_set1_epi32(int((outputs - 1) * weight_row_bytes)));
        // Sixteen outputs' blocks read side by side do not stream from memory at its full speed (a matrix larger
        // than the caches: the output head); the next group's, fetched in order across this group's, do.
        ahead = weights + (o + kOutputLanes) * weight_row_bytes;
        ahead_lines = o + 2 * kOutputLanes <= last ? int64_t(kOutputLanes * weight_row_bytes / 64) : 0;
    }

    // Part b of the 16 outputs: quads[k] holds their values 4k..4k+3 (unsigned), scales[g] the scales of group g.
    template <typename Block>
    void read(int64_t b, int64_t blocks, __m512i quads[kQuads], __m512* scales) const {
        using F = OutputsFormat<Block>;
        for (int64_t line = b * ahead_lines / blocks; line < (b + 1) * ahead_lines / blocks; ++line) {
            _mm_prefetch(ahead + line * 64, _MM_HINT_T1);  // to L2: T0 measured slower, T2 a little
        }
        for (int j = 0; j < kQuads; ++j) {
            const __m256i low = F::values(row_of[j], b);
            const __m256i high = F::values(row_of[j + kQuads], b);
            quads[j] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
        }
        transpose_quads(quads);
        F::scales(F::block(row_of[0], b), gather_index, b, scales);
    }
};

// Rows r0..r0 + Rows − 1 (of `lanes` quantized) times one part of a group: added to their totals. Each group's
// sums lose what the unsigned values added: the offset times the row's sum over the group's values.
template <typename Block, int Rows>
inline void multiply_block(const __m512i quads[kQuads], const __m512* scales, const QuantizedRows& rows, int lanes,
                           int64_t b, int r0, __m512 total[Rows]) {
    using F = OutputsFormat<Block>;
    constexpr int quads_a_group = kQuads / F::kGroups;
    const uint32_t* row_quads = rows.quads + b * kQuads * lanes + r0;
    const float* row_scales = rows.scales + b * lanes + r0;
    const int32_t* halves = rows.half_sums + b * 2 * lanes + r0;
    for (int r = 0; r < Rows; ++r) {
        const __m512 row_scale = _mm512_set1_ps(row_scales[r]);
        for (int g = 0; g < F::kGroups; ++g) {
            const int32_t sum = F::kGroups == 1 ? halves[r] + halves[lanes + r] : halves[g * lanes + r];
            __m512i acc = _mm512_set1_epi32(-F::kOffset * sum);
            for (int k = g * quads_a_group; k < (g + 1) * quads_a_group; ++k) {
                acc = _mm512_dpbusd_epi32(acc, quads[k], _mm512_set1_epi32(int(row_quads[k * lanes + r])));
            }
            total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(scales[g], row_scale), total[r]);
        }
    }
}

template <int Rows>
inline void store_rows(const __m512 total[Rows], int outputs, int r0, char* dst, size_t dst_row_stride, int64_t o) {
    const __mmask16 valid = __mmask16((1u << outputs) - 1);
    for (int r = 0; r < Rows; ++r) {
        _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst + (r0 + r) * dst_row_stride) + o, valid, total[r]);
    }
}

// `Rows` (1..16) rows times outputs first..last (whole groups of 16 but the matrix's last) of a Q8_0, Q5_0 or Q6_K matrix:
// each group's blocks read, transposed and multiplied by every row at once.
template <typename Block, int Rows>
void products_by_outputs(const char* weights, size_t weight_row_bytes, int64_t first, int64_t last, int64_t blocks,
                         const QuantizedRows& rows, char* dst, size_t dst_row_stride) {
    for (int64_t o = first; o < last; o += kOutputLanes) {
        const Group group(weights, weight_row_bytes, o, last);
        __m512 total[Rows];
        for (int r = 0; r < Rows; ++r) total[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; ++b) {
            __m512i quads[kQuads];
            __m512 scales[OutputsFormat<Block>::kGroups];
            group.read<Block>(b, blocks, quads, scales);
            multiply_block<Block, Rows>(quads, scales, rows, Rows, b, 0, total);
        }
        store_rows<Rows>(total, group.outputs, 0, dst, dst_row_stride, o);
    }
}

// `f` called with the row count as a compile-time constant (std::integral_constant), 1..16; more rows than 16 call
// it with 16 (where the caller multiplies by panels).
template <int Rows = 1, typename F>
inline void with_rows(int count, F&& f) {
    if constexpr (Rows < kOutputLanes) {
        if (count > Rows) {
            with_rows<Rows + 1>(count, f);
            return;
        }
    }
    f(std::integral_constant<int, Rows>{});
}

// More than 16 rows (a prefill piece): each group's blocks are transposed once into a panel and multiplied by the
// rows 16 at a time, a few dozen rows at a time so that their quantized blocks stay in L2.
constexpr int kPanelRows = 64;
constexpr int kMostGroups = 2;

struct Panel {
    __m512i* quads = nullptr;
    __m512* scales = nullptr;
    size_t blocks = 0;

    void reserve(size_t need) {
        if (need <= blocks) return;
        free(quads);
        quads = static_cast<__m512i*>(aligned_alloc(64, need * (kQuads + kMostGroups) * sizeof(__m512i)));
        scales = reinterpret_cast<__m512*>(quads + need * kQuads);  // kMostGroups a part
        blocks = need;
    }
};

thread_local Panel t_panel;

template <typename Block, int Rows>
void panel_rows(const Panel& panel, int64_t blocks, const QuantizedRows& rows, int lanes, int r0, int outputs,
                char* dst, size_t dst_row_stride, int64_t o) {
    __m512 total[Rows];
    for (int r = 0; r < Rows; ++r) total[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
        multiply_block<Block, Rows>(panel.quads + b * kQuads, panel.scales + b * kMostGroups, rows, lanes, b, r0, total);
    }
    store_rows<Rows>(total, outputs, r0, dst, dst_row_stride, o);
}

// The rows of x are quantized a panel's worth (64) at a time, so a thread holds 64 rows' quantized blocks however
// long the prefill piece (a 512-token piece of 4864-value rows: 0.4 MB where all of them took 3.4 MB a thread).
template <typename Block>
void products_by_panels(const char* weights, size_t weight_row_bytes, int64_t first, int64_t last, int64_t blocks,
                        const char* x, size_t x_row_stride, int row_count, char* dst, size_t dst_row_stride) {
    t_panel.reserve(size_t(blocks));
    t_rows.reserve(size_t(blocks), kPanelRows);
    for (int top = 0; top < row_count; top += kPanelRows) {
        const int count = top + kPanelRows < row_count ? kPanelRows : row_count - top;
        quantize_rows(x + top * x_row_stride, x_row_stride, count, blocks, count, t_rows);
        char* panel_dst = dst + top * dst_row_stride;
        for (int64_t o = first; o < last; o += kOutputLanes) {
            const Group group(weights, weight_row_bytes, o, last);
            for (int64_t b = 0; b < blocks; ++b) {
                group.read<Block>(b, blocks, t_panel.quads + b * kQuads, t_panel.scales + b * kMostGroups);
            }
            for (int r0 = 0; r0 < count; r0 += kOutputLanes) {
                const int chunk = count - r0 < kOutputLanes ? count - r0 : kOutputLanes;
                with_rows(chunk, [&](auto rows_at_once) {
                    panel_rows<Block, decltype(rows_at_once)::value>(t_panel, blocks, t_rows, count, r0, group.outputs,
                                                                     panel_dst, dst_row_stride, o);
                });
            }
        }
    }
}


// Every thread quantizes x's rows itself and multiplies its share of the outputs: by rows at once where they are
// `Rows` (1..16), by panels where more.
template <typename Block, int Rows>
void run_by_outputs(int rows, const ggml_tensor* w, const ggml_tensor* x, ggml_tensor* dst, int ith, int nth) {
    const int64_t blocks = w->ne[0] / kBlock;
    int64_t first, last;
    outputs_share(w->ne[1], kOutputLanes, ith, nth, first, last);
    if (first >= last) return;
    const char* weights = static_cast<const char*>(w->data);
    const char* values = static_cast<const char*>(x->data);
    char* result = static_cast<char*>(dst->data);
    if (rows > Rows) {
        products_by_panels<Block>(weights, w->nb[1], first, last, blocks, values, x->nb[1], rows, result, dst->nb[1]);
        return;
    }
    t_rows.reserve(size_t(blocks), rows);
    quantize_rows(values, x->nb[1], rows, blocks, rows, t_rows);
    products_by_outputs<Block, Rows>(weights, w->nb[1], first, last, blocks, t_rows, result, dst->nb[1]);
}

template <typename Block>
void dispatch_by_outputs(int rows, const ggml_tensor* w, const ggml_tensor* x, ggml_tensor* dst, int ith, int nth) {
    with_rows(rows, [&](auto rows_at_once) { run_by_outputs<Block, decltype(rows_at_once)::value>(rows, w, x, dst, ith, nth); });
}

// Repacked Q4_K (AVX-512): a chunk's 64 bytes are already eight outputs in pairs of lanes (lane 2j: output j's four
// values at 8(c % 4) .. + 3, lane 2j + 1 the next four), so no transposition: the low nibbles (masked) and the high
// ones (shifted) are the unsigned bytes of `vpdpbusd`, and each row's matching eight quantized bytes are broadcast
// to every pair of lanes. Each sub-block's sums take its scale in float (the rows are quantized per 32 values, as
// for the other types: one scale a sub-block), its min term half in each lane of a pair, and the pairs are added
// when the outputs are stored. ggml's repacked product takes up to 4 rows in one pass over the matrix and reads it
// again for every 4 more (and for each of 1 to 3 rows); this one reads it once for 16 rows and keeps a group's
// blocks in cache for the rest of a panel.

// The panel's rows quantized block-major: block b's rows side by side (row r's eight quads at (b * count + r) * 8, so
// eight bytes are broadcast in one load), its scales and scales times the values' sum (what the min term
// multiplies) likewise, so that a block's rows are read at fixed offsets from one pointer (the rows apart, each
// through its own pointer, took 1.5x as long at one row: the compiler kept the totals in memory).
struct RowsByBlock {
    QuantizedRows one;
    uint32_t* quads = nullptr;
    float* scales = nullptr;
    float* scaled_sums = nullptr;
    size_t capacity = 0;  // blocks × rows held

    void quantize(const char* x, size_t row_stride, int count, int64_t blocks) {
        const size_t need = size_t(count) * size_t(blocks);
        if (need > capacity) {
            free(quads);
            quads = static_cast<uint32_t*>(aligned_alloc(64, (need * (kQuads + 2) * sizeof(uint32_t) + 63) / 64 * 64));
            scales = reinterpret_cast<float*>(quads + need * kQuads);
            scaled_sums = scales + need;
            capacity = need;
        }
        one.reserve(size_t(blocks), 1);
        for (int r = 0; r < count; ++r) {
            quantize_rows(x + r * row_stride, row_stride, 1, blocks, 1, one);
            for (int64_t b = 0; b < blocks; ++b) {
                memcpy(quads + (b * count + r) * kQuads, one.quads + b * kQuads, kQuads * sizeof(uint32_t));
                scales[b * count + r] = one.scales[b];
                scaled_sums[b * count + r] = one.scales[b] * float(one.half_sums[2 * b] + one.half_sums[2 * b + 1]);
            }
        }
    }
};

thread_local RowsByBlock t_rows_by_block;

// Eight half-precision values, each twice (lanes 2j and 2j + 1), in float.
inline __m512 halves_paired(const uint16_t* h) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    return _mm512_cvtph_ps(_mm256_or_si256(wide, _mm256_slli_epi32(wide, 16)));
}

// Eight bytes, each twice, in float.
inline __m512 bytes_paired(uint64_t eight) {
    const __m128i v = _mm_cvtsi64_si128(int64_t(eight));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, v)));
}

// Sub-block `sub`'s eight 6-bit scales and mins as ggml's make_block_q4_Kx8 packs them in 12 bytes: outputs 0-3's
// in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), outputs 4-7's low 4 bits in bytes 8-11 and their top 2 bits
// in the top 2 of bytes 0-7.
inline void q4k_scales(const BlockQ4Kx8& block, int sub, uint64_t& scales, uint64_t& mins) {
    uint32_t a, b, c;
    const uint8_t* at = block.scales + sub * 12;
    memcpy(&a, at, 4);
    memcpy(&b, at + 4, 4);
    memcpy(&c, at + 8, 4);
    scales = uint64_t(a & 0x3f3f3f3fu) | uint64_t((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;
    mins = uint64_t(b & 0x3f3f3f3fu) | uint64_t(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)) << 32;
}

// `Rows` rows (from r0 of the panel's `count`) times one group of eight outputs (its `supers` blocks), stored at
// output o.
template <int Rows>
void q4k_group(const BlockQ4Kx8* blocks, int64_t supers, const RowsByBlock& rows, int count, int r0, char* dst,
               size_t dst_row_stride, int64_t o) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 total[Rows];
    for (int r = 0; r < Rows; ++r) total[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < supers; ++s) {
        const BlockQ4Kx8& block = blocks[s];
        const __m512 d = halves_paired(block.d);
        const __m512 minus_half_dmin = _mm512_mul_ps(halves_paired(block.dmin), _mm512_set1_ps(-0.5f));
        for (int pair = 0; pair < 4; ++pair) {
            __m512i low[4], high[4];
            for (int k = 0; k < 4; ++k) {
                const __m512i chunk = _mm512_loadu_si512(block.qs + (pair * 4 + k) * 64);
                low[k] = _mm512_and_si512(chunk, nibble);
                high[k] = _mm512_and_si512(_mm512_srli_epi16(chunk, 4), nibble);
            }
            __m512 scale[2], min[2];
            for (int sub = 0; sub < 2; ++sub) {
                uint64_t scales, mins;
                q4k_scales(block, pair * 2 + sub, scales, mins);
                scale[sub] = _mm512_mul_ps(d, bytes_paired(scales));
                min[sub] = _mm512_mul_ps(minus_half_dmin, bytes_paired(mins));
            }
            const int64_t b = s * 8 + pair * 2;  // the rows' 32-value block of the pair's first sub-block
            const uint64_t* first_eights = reinterpret_cast<const uint64_t*>(rows.quads + (b * count + r0) * kQuads);
            const uint64_t* second_eights = reinterpret_cast<const uint64_t*>(rows.quads + ((b + 1) * count + r0) * kQuads);
            const float* first_scales = rows.scales + b * count + r0;
            const float* second_scales = rows.scales + (b + 1) * count + r0;
            const float* first_sums = rows.scaled_sums + b * count + r0;
            const float* second_sums = rows.scaled_sums + (b + 1) * count + r0;
#pragma GCC unroll 16
            for (int r = 0; r < Rows; ++r) {
                __m512i first = _mm512_setzero_si512(), second = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int k = 0; k < 4; ++k) {
                    first = _mm512_dpbusd_epi32(first, low[k], _mm512_set1_epi64(int64_t(first_eights[r * 4 + k])));
                    second = _mm512_dpbusd_epi32(second, high[k], _mm512_set1_epi64(int64_t(second_eights[r * 4 + k])));
                }
                total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first), _mm512_mul_ps(scale[0], _mm512_set1_ps(first_scales[r])), total[r]);
                total[r] = _mm512_fmadd_ps(min[0], _mm512_set1_ps(first_sums[r]), total[r]);
                total[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second), _mm512_mul_ps(scale[1], _mm512_set1_ps(second_scales[r])), total[r]);
                total[r] = _mm512_fmadd_ps(min[1], _mm512_set1_ps(second_sums[r]), total[r]);
            }
        }
    }
    for (int r = 0; r < Rows; ++r) {
        const __m512 pairs_added = _mm512_add_ps(total[r], _mm512_permute_ps(total[r], 0xB1));
        const __m256 outputs = _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, pairs_added));
        _mm256_storeu_ps(reinterpret_cast<float*>(dst + (r0 + r) * dst_row_stride) + o, outputs);
    }
}

// This thread's share of the groups of eight outputs; the rows a panel (64) at a time, each group's blocks read
// for the panel's rows 16 at a time.
void run_repacked_q4k(const ggml_tensor* w, const ggml_tensor* x, ggml_tensor* dst, int ith, int nth) {
    const int64_t supers = w->ne[0] / kSuper, row_blocks = w->ne[0] / kBlock;
    int64_t first, last;  // whole groups of eight outputs (a block_q4_Kx8 each)
    outputs_share(w->ne[1], 8, ith, nth, first, last);
    if (first >= last) return;
    const BlockQ4Kx8* all = static_cast<const BlockQ4Kx8*>(w->data);
    const char* values = static_cast<const char*>(x->data);
    char* result = static_cast<char*>(dst->data);
    const int rows = int(x->ne[1]);
    for (int top = 0; top < rows; top += kPanelRows) {
        const int count = top + kPanelRows < rows ? kPanelRows : rows - top;
        t_rows_by_block.quantize(values + top * x->nb[1], x->nb[1], count, row_blocks);
        char* panel_dst = result + top * dst->nb[1];
        for (int64_t g = first / 8; g < last / 8; ++g) {
            for (int r0 = 0; r0 < count; r0 += kOutputLanes) {
                const int chunk = count - r0 < kOutputLanes ? count - r0 : kOutputLanes;
                with_rows(chunk, [&](auto rows_at_once) {
                    q4k_group<decltype(rows_at_once)::value>(all + g * supers, supers, t_rows_by_block, count, r0,
                                                             panel_dst, dst->nb[1], g * 8);
                });
            }
        }
    }
}

// Q6_K packed (AVX-512): the stored layout costs its product more in unpacking and transposing sixteen outputs'
// blocks than in multiplying them by 2 to 4 rows (the 1.5B's output head read at 14-19 GB/s, against ggml's 26 at
// one row). Packed once at load, sixteen outputs' super-block is one 3,360-byte block (sixteen Q6_K blocks' bytes):
// their 16 d values, their 16 × 16 scales by group, and for each of the eight 32-value parts six registers: four of
// low nibbles (register j: byte 4·o + t holds output o's value 4j + t of the part in its low nibble and value
// 4(j + 4) + t in its high one) and two of the top two bits (register h: the same byte holds values 4(4h + c) + t's
// at bits 2c, 2c + 1). A part's eight registers of sixteen outputs' four values, as the stored layout's products
// transpose them, are then two or three instructions each: no shuffles, no gathers.
struct BlockQ6Kx16 {
    uint16_t d[kOutputLanes];
    int8_t scales[kSuper / 16][kOutputLanes];  // [group][output]
    uint8_t parts[kSuper / kBlock][6][64];
};
static_assert(sizeof(BlockQ6Kx16) == kOutputLanes * sizeof(BlockQ6K), "packed Q6_K: the stored blocks' bytes");
constexpr int kPackedLines = int((sizeof(BlockQ6Kx16) + 63) / 64);
constexpr int kLinesAPart = (kPackedLines + kSuper / kBlock - 1) / (kSuper / kBlock);

// Register h's bits 2c, 2c + 1 of every byte at bits 4, 5, the rest zero.
inline __m512i top_bits(__m512i h, int c) {
#if defined(__GFNI__)
    // Each result bit is the parity of the byte ANDed with one byte of the matrix (bit i: byte 7 − i).
    const uint64_t matrix = ((1ull << (2 * c)) << 24) | ((2ull << (2 * c)) << 16);
    return _mm512_gf2p8affine_epi64_epi8(h, _mm512_set1_epi64(int64_t(matrix)), 0);
#else
    const __m512i bits = _mm512_set1_epi8(0x30);
    switch (c) {
        case 0: return _mm512_and_si512(_mm512_slli_epi16(h, 4), bits);
        case 1: return _mm512_and_si512(_mm512_slli_epi16(h, 2), bits);
        case 2: return _mm512_and_si512(h, bits);
        default: return _mm512_and_si512(_mm512_srli_epi16(h, 2), bits);
    }
#endif
}

// Part p of a packed block: quads[k] the sixteen outputs' values 4k .. 4k + 3 (unsigned, q), scales[g] their scales
// of the part's group g times d.
inline void read_packed_part(const BlockQ6Kx16& block, int p, __m512 d, __m512i quads[kQuads], __m512 scales[2]) {
    const uint8_t(*registers)[64] = block.parts[p];
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i top[2] = {_mm512_loadu_si512(registers[4]), _mm512_loadu_si512(registers[5])};
    for (int j = 0; j < 4; ++j) {
        const __m512i low = _mm512_loadu_si512(registers[j]);
        // 0xEC: (a & c) | b, the low nibble masked and the top bits (already alone at 4, 5) added.
        quads[j] = _mm512_ternarylogic_epi32(low, top_bits(top[0], j), nibble, 0xEC);
        quads[j + 4] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(low, 4), top_bits(top[1], j), nibble, 0xEC);
    }
    for (int g = 0; g < 2; ++g) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.scales[2 * p + g]));
        scales[g] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
    }
}

// `Rows` rows (from r0 of the `lanes` quantized) times sixteen outputs' packed blocks, stored at output o.
template <int Rows>
void packed_q6k_group(const BlockQ6Kx16* blocks, int64_t supers, const QuantizedRows& rows, int lanes, int r0,
                      char* dst, size_t dst_row_stride, int64_t o) {
    constexpr int parts = kSuper / kBlock;
    __m512 total[Rows];
    for (int r = 0; r < Rows; ++r) total[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < supers; ++s) {
        const BlockQ6Kx16& block = blocks[s];
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.d)));
        // The next block (this group's, or the next group's first: they lie in order) fetched a part's share at a
        // time: measured on the 1.5B's head at 4 rows 5.2-6.1 ms against 6.7-7.9 without, 2 and 3 blocks ahead no
        // better (T0; prefetching past the matrix's end is harmless).
        const char* next = reinterpret_cast<const char*>(blocks + s + 1);
        for (int p = 0; p < parts; ++p) {
            for (int line = p * kLinesAPart; line < (p + 1) * kLinesAPart && line < kPackedLines; ++line) {
                _mm_prefetch(next + line * 64, _MM_HINT_T0);
            }
            __m512i quads[kQuads];
            __m512 scales[2];
            read_packed_part(block, p, d, quads, scales);
            multiply_block<BlockQ6K, Rows>(quads, scales, rows, lanes, s * parts + p, r0, total);
        }
    }
    store_rows<Rows>(total, kOutputLanes, r0, dst, dst_row_stride, o);
}

// This thread's share of the groups of sixteen outputs; the rows a panel (64) at a time, each group's blocks read
// for the panel's rows 16 at a time (unpacking them again costs little: as fast as ggml's tiled product at 512 rows).
void run_packed_q6k(const ggml_tensor* w, const ggml_tensor* x, ggml_tensor* dst, int ith, int nth) {
    const int64_t supers = w->ne[0] / kSuper, blocks = w->ne[0] / kBlock;
    int64_t first, last;
    outputs_share(w->ne[1], kOutputLanes, ith, nth, first, last);
    if (first >= last) return;
    const BlockQ6Kx16* all = static_cast<const BlockQ6Kx16*>(w->data);
    const char* values = static_cast<const char*>(x->data);
    char* result = static_cast<char*>(dst->data);
    const int rows = int(x->ne[1]);
    for (int top = 0; top < rows; top += kPanelRows) {
        const int count = top + kPanelRows < rows ? kPanelRows : rows - top;
        t_rows.reserve(size_t(blocks), count);
        quantize_rows(values + top * x->nb[1], x->nb[1], count, blocks, count, t_rows);
        char* panel_dst = result + top * dst->nb[1];
        for (int64_t o = first; o < last; o += kOutputLanes) {
            for (int r0 = 0; r0 < count; r0 += kOutputLanes) {
                const int chunk = count - r0 < kOutputLanes ? count - r0 : kOutputLanes;
                with_rows(chunk, [&](auto rows_at_once) {
                    packed_q6k_group<decltype(rows_at_once)::value>(all + (o / kOutputLanes) * supers, supers, t_rows,
                                                                    count, r0, panel_dst, dst->nb[1], o);
                });
            }
        }
    }
}

// Where output o's value v (of its super-block) lies in a packed block: its low nibble's byte and shift, its top
// bits' byte and shift (a byte offset into `parts`).
inline void packed_place(int o, int v, int& low_at, int& low_shift, int& top_at, int& top_shift) {
    const int part = v / kBlock, quad = (v % kBlock) / 4, t = v % 4;
    const int byte = 4 * o + t;
    low_at = (part * 6 + quad % 4) * 64 + byte;
    low_shift = 4 * (quad / 4);
    top_at = (part * 6 + 4 + quad / 4) * 64 + byte;
    top_shift = 2 * (quad % 4);
}
#endif

template <typename L>
void run(const ggml_tensor* w, const ggml_tensor* x, ggml_tensor* dst, int ith, int nth) {
    const int64_t in = w->ne[0];
    const int64_t out = w->ne[1];
    const int rows = int(x->ne[1]);
    const int64_t blocks = in / kBlock;
    t_rows.reserve(size_t(blocks), L::kLanes);
    quantize_rows(static_cast<const char*>(x->data), x->nb[1], rows, blocks, L::kLanes, t_rows);
    int64_t first, last;  // a contiguous share of the outputs, in whole groups of eight
    outputs_share(out, kOutputsAtOnce, ith, nth, first, last);
    if (first >= last) return;
    const char* weights = static_cast<const char*>(w->data);
    char* result = static_cast<char*>(dst->data);
    if (w->type == GGML_TYPE_Q8_0) {
        products<L, BlockQ8>(weights, w->nb[1], first, last, blocks, t_rows, rows, result, dst->nb[1]);
    } else if (w->type == GGML_TYPE_Q6_K) {
        products<L, BlockQ6K>(weights, w->nb[1], first, last, blocks, t_rows, rows, result, dst->nb[1]);
    } else {
        products<L, BlockQ5>(weights, w->nb[1], first, last, blocks, t_rows, rows, result, dst->nb[1]);
    }
}

}  // namespace

int exo_rows_min(int type, int64_t in_features) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (type == GGML_TYPE_Q4_K) return 1;  // repacked only (block_q4_Kx8)
#endif
    if (type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q5_0 && type != GGML_TYPE_Q6_K) return 0;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (type != GGML_TYPE_Q6_K) return 1;
    return in_features <= 2048 ? 2 : 3;
#else
    (void)in_features;
    return 5;
#endif
}

int exo_rows_most(int type) {
    const bool taken = exo_rows_min(type, kSuper) > 0;  // at some row length (any: each type's are whole blocks)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (type == GGML_TYPE_Q6_K) return 128;  // more: ggml's tiled Q6_K product is as fast
    if (taken) return 1 << 30;
#endif
    return taken ? EXO_ROWS_MAX : 0;
}

int exo_q6k_packs(int64_t out, int64_t in) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    return out > 0 && in > 0 && out % kOutputLanes == 0 && in % kSuper == 0;
#else
    (void)out;
    (void)in;
    return 0;
#endif
}

int exo_q6k_pack(const void* stored, void* packed, int64_t out, int64_t in) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (!exo_q6k_packs(out, in)) return -1;
    const int64_t supers = in / kSuper;
    const BlockQ6K* rows = static_cast<const BlockQ6K*>(stored);
    BlockQ6Kx16* groups = static_cast<BlockQ6Kx16*>(packed);
    for (int64_t g = 0; g < out / kOutputLanes; ++g) {
        for (int64_t s = 0; s < supers; ++s) {
            BlockQ6Kx16& into = groups[g * supers + s];
            for (int o = 0; o < kOutputLanes; ++o) {
                const BlockQ6K& block = rows[(g * kOutputLanes + o) * supers + s];
                into.d[o] = block.d;
                for (int group = 0; group < kSuper / 16; ++group) into.scales[group][o] = block.scales[group];
                for (int part = 0; part < kSuper / kBlock; ++part) {
                    // Four values (a quad) a 32-bit word: register j's word for output o is quad j's low nibbles
                    // with quad j + 4's above them; register 4 + h's holds quads 4h .. 4h + 3's top bits.
                    alignas(32) uint32_t quad[kQuads];
                    _mm256_store_si256(reinterpret_cast<__m256i*>(quad), unpack_q6k(block, part));
                    uint32_t words[6];
                    for (int j = 0; j < 4; ++j) words[j] = (quad[j] & 0x0F0F0F0Fu) | (quad[j + 4] & 0x0F0F0F0Fu) << 4;
                    for (int h = 0; h < 2; ++h) {
                        words[4 + h] = 0;
                        for (int c = 0; c < 4; ++c) words[4 + h] |= ((quad[4 * h + c] >> 4) & 0x03030303u) << (2 * c);
                    }
                    for (int r = 0; r < 6; ++r) memcpy(&into.parts[part][r][4 * o], &words[r], sizeof(uint32_t));
                }
            }
        }
    }
    return 0;
#else
    (void)stored;
    (void)packed;
    (void)out;
    (void)in;
    return -1;
#endif
}

int exo_q6k_unpack(const void* packed, void* stored, int64_t out, int64_t in) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (!exo_q6k_packs(out, in)) return -1;
    const int64_t supers = in / kSuper;
    const BlockQ6Kx16* groups = static_cast<const BlockQ6Kx16*>(packed);
    BlockQ6K* rows = static_cast<BlockQ6K*>(stored);
    for (int64_t g = 0; g < out / kOutputLanes; ++g) {
        for (int64_t s = 0; s < supers; ++s) {
            const BlockQ6Kx16& from = groups[g * supers + s];
            const uint8_t* parts = &from.parts[0][0][0];
            for (int o = 0; o < kOutputLanes; ++o) {
                BlockQ6K& block = rows[(g * kOutputLanes + o) * supers + s];
                memset(&block, 0, sizeof(block));
                block.d = from.d[o];
                for (int group = 0; group < kSuper / 16; ++group) block.scales[group] = from.scales[group][o];
                for (int v = 0; v < kSuper; ++v) {
                    int low_at, low_shift, top_at, top_shift;
                    packed_place(o, v, low_at, low_shift, top_at, top_shift);
                    const int q = ((parts[low_at] >> low_shift) & 0x0F) | (((parts[top_at] >> top_shift) & 0x03) << 4);
                    // ggml's Q6_K (dequantize_row_q6_K): 128 values a half; in it, value 32k + l (k = 0..3, l < 32)
                    // has its low nibble in ql[l + 32 (k & 1)] (high nibble for k ≥ 2) and its top bits at 2k of qh[l].
                    const int half = v / 128, k = (v % 128) / 32, l = v % 32;
                    block.ql[half * 64 + l + 32 * (k & 1)] |= uint8_t((q & 0x0F) << (4 * (k / 2)));
                    block.qh[half * 32 + l] |= uint8_t((q >> 4) << (2 * k));
                }
            }
        }
    }
    return 0;
#else
    (void)packed;
    (void)stored;
    (void)out;
    (void)in;
    return -1;
#endif
}

void exo_rows_mul_mat_packed_q6k(struct ggml_tensor* dst, int ith, int nth, void* /*userdata*/) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    run_packed_q6k(dst->src[0], dst->src[1], dst, ith, nth);
#else
    (void)dst;
    (void)ith;
    (void)nth;
    fputs("exo rows kernel: packed Q6_K needs AVX-512 VNNI\n", stderr);
    abort();
#endif
}

void exo_rows_mul_mat(struct ggml_tensor* dst, int ith, int nth, void* /*userdata*/) {
    const ggml_tensor* w = dst->src[0];
    const ggml_tensor* x = dst->src[1];
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (w->type == GGML_TYPE_Q4_K) {
        if (w->extra == nullptr) {  // its blocks as stored: rows_kernel.py passes only repacked Q4_K here
            fputs("exo rows kernel: a Q4_K matrix not held repacked\n", stderr);
            abort();
        }
        run_repacked_q4k(w, x, dst, ith, nth);
        return;
    }
    if (w->type == GGML_TYPE_Q8_0) {
        dispatch_by_outputs<BlockQ8>(int(x->ne[1]), w, x, dst, ith, nth);
        return;
    }
    if (w->type == GGML_TYPE_Q5_0) {
        dispatch_by_outputs<BlockQ5>(int(x->ne[1]), w, x, dst, ith, nth);
        return;
    }
    dispatch_by_outputs<BlockQ6K>(int(x->ne[1]), w, x, dst, ith, nth);
#else
    run<Lanes8>(w, x, dst, ith, nth);
#endif
}

#else

int exo_rows_min(int /*type*/, int64_t /*in_features*/) { return 0; }
int exo_rows_most(int /*type*/) { return 0; }
void exo_rows_mul_mat(struct ggml_tensor* /*dst*/, int /*ith*/, int /*nth*/, void* /*userdata*/) { abort(); }
int exo_q6k_packs(int64_t /*out*/, int64_t /*in*/) { return 0; }
int exo_q6k_pack(const void* /*stored*/, void* /*packed*/, int64_t /*out*/, int64_t /*in*/) { return -1; }
int exo_q6k_unpack(const void* /*packed*/, void* /*stored*/, int64_t /*out*/, int64_t /*in*/) { return -1; }
void exo_rows_mul_mat_packed_q6k(struct ggml_tensor* /*dst*/, int /*ith*/, int /*nth*/, void* /*userdata*/) { abort(); }

#endif
