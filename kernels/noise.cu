// noise.cu: NumPy's float32 normal stream drawn on the GPU, bit for bit:
//   numpy.random.Generator(PCG64(seed)).standard_normal(n, dtype=float32)
// i.e. PCG64 (XSL-RR 128/64) outputs split into 32-bit words, low half first, the high half kept
// across calls (NumPy's has_uint32 / uinteger), fed to the float ziggurat of NumPy's
// random_standard_normal_f (numpy/random/src/distributions/distributions.c, NumPy >= 1.22).
//
// A normal consumes a variable number of words. Its first word r gives the layer (r & 0xff), the
// sign (bit 8) and rabs (bits 9..31); x = rabs * wi[layer] is accepted at once when rabs <
// ki[layer] (98.5% of words). The others ("specials") read more words: the wedge test one, the tail
// two per try. So one draw of n normals is three launches, never a host sync:
//   noise_words: the first W words of the stream (W = n + a margin, a multiple of 32), 32 per
//     thread after an O(log) jump ahead of the LCG, and a bit per word: special or not.
//   noise_walk (one block): compacts the specials in stream order and evaluates each as if an
//     attempt started there (in parallel); one warp then walks them in order to find the real
//     attempt starts (a special inside an earlier attempt's words is skipped), writes their
//     values and marks every word that yields no normal (a "hole"); then the holes' prefix counts
//     per 32 words and the generator state after the draw.
//   noise_emit: every other word p is a normal, at output index p - (holes before p).
// Output: fp32, NCHW order as NumPy fills it, or (C > 0) scattered to NHWC (the executor's x).
// Images: one launch set draws for several generators at once (a sampler's batch), image j the
// grid's y index (noise_words, noise_emit) or block (noise_walk): its state st[j], its scratch slot j
// (slot_groups groups of 32 words, slot_cap specials), its output at out + j * out_stride floats.
// Exactness: the fast and wedge values are NumPy's float operations (IEEE single, no contraction:
// __fmul_rn / __fadd_rn). The wedge compares a float with a double exp(), which libms round
// differently within an ulp: a comparison within 2^window ulps of flipping sets NOISE_AMBIGUOUS
// instead of being trusted. The tail's log1pf is glibc's float algorithm (fdlibm) op for op
// (log1pf_mode 0) or the correctly rounded value through double (mode 1, same ambiguity rule),
// whichever this host's NumPy was found to use (runtime/gpu/noise_ref.py). A draw that needs more
// than W words sets NOISE_SHORT. The host reads the flags after a run and redraws on the host.
// Launch (K images): noise_words (ceil(G/128), K) x 128 (G = W/32), noise_walk K x 256, noise_emit
// (ceil(G/8), K) x 256.
// Reference: runtime/gpu/noise_ref.py (this algorithm in NumPy) and NumPy itself.

#define NOISE_AMBIGUOUS 1u
#define NOISE_SHORT 2u
#define PCG_MULT_HI 0x2360ed051fc65da4ull   // PCG's default 128-bit multiplier
#define PCG_MULT_LO 0x4385df649fccf645ull
#define ZIG_R_F 0x4069dda4u                 // ziggurat_nor_r_f = 3.6541529f
#define ZIG_INV_R_F 0x3e8c1d53u             // ziggurat_nor_inv_r_f = 0.27366123f
// fdlibm's log1pf constants (glibc sysdeps/ieee754/flt-32/s_log1pf.c)
#define L1P_LN2_HI 0x3f317180u
#define L1P_LN2_LO 0x3717f7d1u
#define L1P_TWO3RD 0x3f2aaaabu
#define L1P_LP1 0x3f2aaaabu
#define L1P_LP2 0x3ecccccdu
#define L1P_LP3 0x3e924925u
#define L1P_LP4 0x3e638e29u
#define L1P_LP5 0x3e3a3325u
#define L1P_LP6 0x3e1cd04fu
#define L1P_LP7 0x3e178897u

// NumPy's PCG64 state dict in device memory (runtime/gpu/noise.py packs it; 64 bytes).
struct NoiseState {
    unsigned long long s_lo, s_hi, inc_lo, inc_hi;
    unsigned int has_uint32, uinteger;
    unsigned int flags;       // sticky NOISE_* bits
    unsigned int consumed;    // words the last draw used
    int log1pf_mode;          // 0: fdlibm (glibc), 1: correctly rounded
    int window;               // log2 of the ambiguity window in ulps
    unsigned int pad[2];
};

// Tables of NumPy's ziggurat_constants.h: ki_float, and wi_float / fi_float as float32 bits.
__device__ const unsigned int ZIG_KI[256] = {
    0x007799ec, 0x00000000, 0x006045f5, 0x006d1aa8, 0x00728fb4, 0x007592af, 0x00777a5c, 0x0078ca38,
    0x0079bf6b, 0x007a7a35, 0x007b0d2f, 0x007b83d4, 0x007be597, 0x007c3788, 0x007c7d33, 0x007cb926,
    0x007ced48, 0x007d1b08, 0x007d437f, 0x007d678b, 0x007d87db, 0x007da4fc, 0x007dbf61, 0x007dd767,
    0x007ded5d, 0x007e0183, 0x007e1411, 0x007e2534, 0x007e3515, 0x007e43d5, 0x007e5193, 0x007e5e67,
    0x007e6a69, 0x007e75aa, 0x007e803e, 0x007e8a32, 0x007e9395, 0x007e9c72, 0x007ea4d5, 0x007eacc6,
    0x007eb44e, 0x007ebb75, 0x007ec243, 0x007ec8bc, 0x007ecee8, 0x007ed4cc, 0x007eda6b, 0x007edfcb,
    0x007ee4ef, 0x007ee9dc, 0x007eee94, 0x007ef31b, 0x007ef774, 0x007efba0, 0x007effa3, 0x007f037f,
    0x007f0736, 0x007f0aca, 0x007f0e3c, 0x007f118f, 0x007f14c4, 0x007f17dc, 0x007f1ada, 0x007f1dbd,
    0x007f2087, 0x007f233a, 0x007f25d7, 0x007f285d, 0x007f2ad0, 0x007f2d2e, 0x007f2f7a, 0x007f31b3,
    0x007f33dc, 0x007f35f3, 0x007f37fb, 0x007f39f3, 0x007f3bdc, 0x007f3db7, 0x007f3f84, 0x007f4145,
    0x007f42f8, 0x007f449f, 0x007f463a, 0x007f47ca, 0x007f494e, 0x007f4ac8, 0x007f4c38, 0x007f4d9d,
    0x007f4ef9, 0x007f504c, 0x007f5195, 0x007f52d5, 0x007f540d, 0x007f553d, 0x007f5664, 0x007f5784,
    0x007f589c, 0x007f59ac, 0x007f5ab5, 0x007f5bb8, 0x007f5cb3, 0x007f5da8, 0x007f5e96, 0x007f5f7e,
    0x007f605f, 0x007f613b, 0x007f6210, 0x007f62e0, 0x007f63aa, 0x007f646f, 0x007f652e, 0x007f65e8,
    0x007f669c, 0x007f674c, 0x007f67f6, 0x007f689c, 0x007f693c, 0x007f69d9, 0x007f6a70, 0x007f6b03,
    0x007f6b91, 0x007f6c1b, 0x007f6ca0, 0x007f6d21, 0x007f6d9e, 0x007f6e17, 0x007f6e8c, 0x007f6efc,
    0x007f6f68, 0x007f6fd1, 0x007f7035, 0x007f7096, 0x007f70f3, 0x007f714c, 0x007f71a1, 0x007f71f2,
    0x007f723f, 0x007f7289, 0x007f72cf, 0x007f7312, 0x007f7350, 0x007f738b, 0x007f73c3, 0x007f73f6,
    0x007f7427, 0x007f7453, 0x007f747c, 0x007f74a1, 0x007f74c3, 0x007f74e0, 0x007f74fb, 0x007f7511,
    0x007f7524, 0x007f7533, 0x007f753f, 0x007f7546, 0x007f754a, 0x007f754b, 0x007f7547, 0x007f753f,
    0x007f7534, 0x007f7524, 0x007f7511, 0x007f74f9, 0x007f74de, 0x007f74be, 0x007f749a, 0x007f7472,
    0x007f7445, 0x007f7414, 0x007f73df, 0x007f73a5, 0x007f7366, 0x007f7323, 0x007f72da, 0x007f728d,
    0x007f723a, 0x007f71e3, 0x007f7186, 0x007f7123, 0x007f70bb, 0x007f704d, 0x007f6fd9, 0x007f6f5f,
    0x007f6edf, 0x007f6e58, 0x007f6dcb, 0x007f6d37, 0x007f6c9c, 0x007f6bf9, 0x007f6b4f, 0x007f6a9c,
    0x007f69e2, 0x007f691f, 0x007f6854, 0x007f677f, 0x007f66a1, 0x007f65b8, 0x007f64c6, 0x007f63c8,
    0x007f62c0, 0x007f61ab, 0x007f608a, 0x007f5f5d, 0x007f5e21, 0x007f5cd8, 0x007f5b7f, 0x007f5a17,
    0x007f589e, 0x007f5713, 0x007f5575, 0x007f53c4, 0x007f51fe, 0x007f5022, 0x007f4e2f, 0x007f4c22,
    0x007f49fa, 0x007f47b6, 0x007f4553, 0x007f42cf, 0x007f4028, 0x007f3d5a, 0x007f3a64, 0x007f3741,
    0x007f33ed, 0x007f3065, 0x007f2ca4, 0x007f28a4, 0x007f245f, 0x007f1fce, 0x007f1aea, 0x007f15a9,
    0x007f1000, 0x007f09e4, 0x007f0346, 0x007efc16, 0x007ef43e, 0x007eeba8, 0x007ee237, 0x007ed7c8,
    0x007ecc2f, 0x007ebf37, 0x007eb09d, 0x007ea00a, 0x007e8d0d, 0x007e7710, 0x007e5d47, 0x007e3e93,
    0x007e1959, 0x007deb2c, 0x007db036, 0x007d6203, 0x007cf4b9, 0x007c4fd2, 0x007b3630, 0x0078d2d2};
__device__ const unsigned int ZIG_WI[256] = {
    0x34fa49dc, 0x32dc685f, 0x3312857a, 0x332be5ca, 0x33400fe7, 0x33511861, 0x33600269, 0x336d617b,
    0x33799241, 0x33826991, 0x3387a82a, 0x338c9535, 0x33913d14, 0x3395a972, 0x3399e1fe, 0x339decf6,
    0x33a1cf7c, 0x33a58dda, 0x33a92bab, 0x33acac05, 0x33b0118e, 0x33b35e93, 0x33b69515, 0x33b9b6d7,
    0x33bcc569, 0x33bfc22d, 0x33c2ae63, 0x33c58b25, 0x33c85975, 0x33cb1a3c, 0x33cdce4c, 0x33d07667,
    0x33d3133b, 0x33d5a56b, 0x33d82d8b, 0x33daac24, 0x33dd21b4, 0x33df8eb1, 0x33e1f388, 0x33e4509d,
    0x33e6a650, 0x33e8f4f8, 0x33eb3ce9, 0x33ed7e70, 0x33efb9d5, 0x33f1ef5e, 0x33f41f4a, 0x33f649d6,
    0x33f86f3c, 0x33fa8fb3, 0x33fcab6d, 0x33fec29c, 0x34006ab7, 0x34017208, 0x34027755, 0x34037ab3,
    0x34047c35, 0x34057bec, 0x340679eb, 0x34077642, 0x34087102, 0x34096a38, 0x340a61f5, 0x340b5846,
    0x340c4d39, 0x340d40db, 0x340e3338, 0x340f245d, 0x34101455, 0x3411032c, 0x3411f0ec, 0x3412dda0,
    0x3413c953, 0x3414b40e, 0x34159ddb, 0x341686c3, 0x34176ecf, 0x34185608, 0x34193c77, 0x341a2224,
    0x341b0716, 0x341beb56, 0x341cceeb, 0x341db1de, 0x341e9435, 0x341f75f7, 0x3420572c, 0x342137d9,
    0x34221807, 0x3422f7bc, 0x3423d6fd, 0x3424b5d2, 0x34259440, 0x3426724d, 0x34275001, 0x34282d5f,
    0x34290a70, 0x3429e737, 0x342ac3ba, 0x342ba000, 0x342c7c0e, 0x342d57e9, 0x342e3397, 0x342f0f1c,
    0x342fea7e, 0x3430c5c3, 0x3431a0ef, 0x34327c08, 0x34335713, 0x34343214, 0x34350d11, 0x3435e80f,
    0x3436c313, 0x34379e22, 0x34387940, 0x34395473, 0x343a2fbf, 0x343b0b2a, 0x343be6b8, 0x343cc26e,
    0x343d9e52, 0x343e7a68, 0x343f56b4, 0x3440333d, 0x34411007, 0x3441ed16, 0x3442ca71, 0x3443a81b,
    0x3444861b, 0x34456475, 0x3446432d, 0x3447224b, 0x344801d1, 0x3448e1c7, 0x3449c231, 0x344aa314,
    0x344b8476, 0x344c665c, 0x344d48cd, 0x344e2bcc, 0x344f0f61, 0x344ff391, 0x3450d862, 0x3451bdd9,
    0x3452a3fd, 0x34538ad4, 0x34547263, 0x34555ab2, 0x345643c6, 0x34572da7, 0x3458185a, 0x345903e8,
    0x3459f055, 0x345addaa, 0x345bcbee, 0x345cbb28, 0x345dab5f, 0x345e9c9b, 0x345f8ee5, 0x34608243,
    0x346176bf, 0x34626c61, 0x34636330, 0x34645b37, 0x3465547e, 0x34664f0e, 0x34674af2, 0x34684832,
    0x346946d9, 0x346a46f1, 0x346b4885, 0x346c4ba0, 0x346d504d, 0x346e5698, 0x346f5e8d, 0x34706838,
    0x347173a6, 0x347280e5, 0x34739001, 0x3474a10a, 0x3475b40e, 0x3476c91c, 0x3477e043, 0x3478f994,
    0x347a1520, 0x347b32f9, 0x347c5330, 0x347d75d9, 0x347e9b07, 0x347fc2ce, 0x348076a2, 0x34810d40,
    0x3481a54c, 0x34823ed2, 0x3482d9e0, 0x34837681, 0x348414c4, 0x3484b4b8, 0x3485566c, 0x3485f9ef,
    0x34869f52, 0x348746a6, 0x3487efff, 0x34889b70, 0x3489490d, 0x3489f8eb, 0x348aab22, 0x348b5fca,
    0x348c16fc, 0x348cd0d3, 0x348d8d6c, 0x348e4ce5, 0x348f0f60, 0x348fd4fe, 0x34909de5, 0x34916a3c,
    0x34923a2d, 0x34930de6, 0x3493e598, 0x3494c176, 0x3495a1bb, 0x349686a2, 0x3497706e, 0x34985f67,
    0x349953db, 0x349a4e20, 0x349b4e94, 0x349c559d, 0x349d63ac, 0x349e793e, 0x349f96dd, 0x34a0bd25,
    0x34a1ecc1, 0x34a32672, 0x34a46b14, 0x34a5bb9d, 0x34a71928, 0x34a884fb, 0x34aa008b, 0x34ab8d8d,
    0x34ad2e04, 0x34aee451, 0x34b0b34e, 0x34b29e74, 0x34b4aa06, 0x34b6db5c, 0x34b93948, 0x34bbccab,
    0x34bea170, 0x34c1c818, 0x34c5587e, 0x34c97705, 0x34ce5f70, 0x34d47ee4, 0x34dcc0fa, 0x34e9dda4};
__device__ const unsigned int ZIG_FI[256] = {
    0x3f800000, 0x3f7a2356, 0x3f75baa3, 0x3f71f88f, 0x3f6e9b7d, 0x3f6b8490, 0x3f68a24c, 0x3f65e99d,
    0x3f6352f6, 0x3f60d8e7, 0x3f5e775a, 0x3f5c2b2a, 0x3f59f1d4, 0x3f57c952, 0x3f55aff8, 0x3f53a45f,
    0x3f51a558, 0x3f4fb1df, 0x3f4dc914, 0x3f4bea33, 0x3f4a148e, 0x3f48478e, 0x3f4682aa, 0x3f44c56a,
    0x3f430f60, 0x3f416028, 0x3f3fb76a, 0x3f3e14d4, 0x3f3c781a, 0x3f3ae0f8, 0x3f394f30, 0x3f37c286,
    0x3f363ac5, 0x3f34b7bb, 0x3f333939, 0x3f31bf15, 0x3f304925, 0x3f2ed743, 0x3f2d694d, 0x3f2bff21,
    0x3f2a98a0, 0x3f2935ab, 0x3f27d627, 0x3f2679fa, 0x3f25210c, 0x3f23cb43, 0x3f22788a, 0x3f2128cc,
    0x3f1fdbf5, 0x3f1e91f1, 0x3f1d4aad, 0x3f1c0619, 0x3f1ac424, 0x3f1984be, 0x3f1847d8, 0x3f170d63,
    0x3f15d551, 0x3f149f94, 0x3f136c21, 0x3f123aeb, 0x3f110be5, 0x3f0fdf05, 0x3f0eb440, 0x3f0d8b8b,
    0x3f0c64dc, 0x3f0b4029, 0x3f0a1d69, 0x3f08fc92, 0x3f07dd9d, 0x3f06c081, 0x3f05a534, 0x3f048bb1,
    0x3f0373ee, 0x3f025de5, 0x3f01498f, 0x3f0036e4, 0x3efe4bbc, 0x3efc2ced, 0x3efa114e, 0x3ef7f8d4,
    0x3ef5e371, 0x3ef3d11b, 0x3ef1c1c7, 0x3eefb56a, 0x3eedabfa, 0x3eeba56b, 0x3ee9a1b5, 0x3ee7a0ce,
    0x3ee5a2ac, 0x3ee3a746, 0x3ee1ae93, 0x3edfb88c, 0x3eddc527, 0x3edbd45c, 0x3ed9e623, 0x3ed7fa75,
    0x3ed6114a, 0x3ed42a9a, 0x3ed2465f, 0x3ed06492, 0x3ece852b, 0x3ecca824, 0x3ecacd77, 0x3ec8f51d,
    0x3ec71f10, 0x3ec54b4a, 0x3ec379c5, 0x3ec1aa7c, 0x3ebfdd69, 0x3ebe1285, 0x3ebc49cd, 0x3eba833b,
    0x3eb8beca, 0x3eb6fc74, 0x3eb53c35, 0x3eb37e09, 0x3eb1c1ea, 0x3eb007d4, 0x3eae4fc2, 0x3eac99b1,
    0x3eaae59c, 0x3ea9337e, 0x3ea78354, 0x3ea5d51b, 0x3ea428cd, 0x3ea27e67, 0x3ea0d5e7, 0x3e9f2f47,
    0x3e9d8a84, 0x3e9be79b, 0x3e9a4689, 0x3e98a74a, 0x3e9709dc, 0x3e956e3a, 0x3e93d462, 0x3e923c51,
    0x3e90a604, 0x3e8f1178, 0x3e8d7eaa, 0x3e8bed97, 0x3e8a5e3e, 0x3e88d09a, 0x3e8744ab, 0x3e85ba6c,
    0x3e8431dc, 0x3e82aaf9, 0x3e8125c0, 0x3e7f445c, 0x3e7c4084, 0x3e793ff3, 0x3e7642a5, 0x3e734896,
    0x3e7051c1, 0x3e6d5e23, 0x3e6a6db8, 0x3e67807c, 0x3e64966d, 0x3e61af86, 0x3e5ecbc4, 0x3e5beb24,
    0x3e590da3, 0x3e56333d, 0x3e535bf0, 0x3e5087ba, 0x3e4db696, 0x3e4ae883, 0x3e481d7e, 0x3e455585,
    0x3e429094, 0x3e3fceab, 0x3e3d0fc7, 0x3e3a53e5, 0x3e379b04, 0x3e34e522, 0x3e32323d, 0x3e2f8254,
    0x3e2cd564, 0x3e2a2b6d, 0x3e27846d, 0x3e24e063, 0x3e223f4e, 0x3e1fa12c, 0x3e1d05fd, 0x3e1a6dc0,
    0x3e17d874, 0x3e154619, 0x3e12b6ad, 0x3e102a31, 0x3e0da0a5, 0x3e0b1a07, 0x3e089659, 0x3e06159a,
    0x3e0397ca, 0x3e011ceb, 0x3dfd49f6, 0x3df85ff9, 0x3df37be0, 0x3dee9dab, 0x3de9c55e, 0x3de4f2fa,
    0x3de02683, 0x3ddb5ffc, 0x3dd69f67, 0x3dd1e4ca, 0x3dcd3027, 0x3dc88184, 0x3dc3d8e5, 0x3dbf3650,
    0x3dba99cb, 0x3db6035c, 0x3db17309, 0x3dace8db, 0x3da864d8, 0x3da3e70a, 0x3d9f6f79, 0x3d9afe2f,
    0x3d969336, 0x3d922e9a, 0x3d8dd066, 0x3d8978a7, 0x3d852769, 0x3d80dcbd, 0x3d793161, 0x3d70b6aa,
    0x3d684978, 0x3d5fe9f0, 0x3d57983d, 0x3d4f5488, 0x3d471f01, 0x3d3ef7dc, 0x3d36df4e, 0x3d2ed592,
    0x3d26dae8, 0x3d1eef96, 0x3d1713e7, 0x3d0f482d, 0x3d078cc1, 0x3cffc40f, 0x3cf090d7, 0x3ce180cc,
    0x3cd294fa, 0x3cc3ce8e, 0x3cb52ed8, 0x3ca6b758, 0x3c9869c4, 0x3c8a481a, 0x3c78a952, 0x3c5d2469,
    0x3c420820, 0x3c275cb2, 0x3c0d2c91, 0x3be70b08, 0x3bb4f547, 0x3b8450f8, 0x3b2afcfa, 0x3aa5302e};

// ---- 128-bit LCG --------------------------------------------------------------------------------
struct U128 { unsigned long long lo, hi; };

__device__ __forceinline__ U128 mul128(U128 a, U128 b) {   // mod 2^128
    U128 r;
    r.lo = a.lo * b.lo;
    r.hi = __umul64hi(a.lo, b.lo) + a.lo * b.hi + a.hi * b.lo;
    return r;
}

__device__ __forceinline__ U128 add128(U128 a, U128 b) {
    U128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);
    return r;
}

// The state d steps later: s * MULT^d + inc * (MULT^(d-1) + ... + 1), by squaring (Brown 1994;
// NumPy's PCG64.advance computes the same).
__device__ U128 pcg_jump(U128 s, U128 inc, unsigned long long d) {
    U128 am = {1ull, 0ull}, ap = {0ull, 0ull}, cm = {PCG_MULT_LO, PCG_MULT_HI}, cp = inc;
    const U128 one = {1ull, 0ull};
    while (d) {
        if (d & 1ull) {
            am = mul128(am, cm);
            ap = add128(mul128(ap, cm), cp);
        }
        cp = mul128(add128(cm, one), cp);
        cm = mul128(cm, cm);
        d >>= 1;
    }
    return add128(mul128(am, s), ap);
}

__device__ __forceinline__ U128 pcg_step(U128 s, U128 inc) {
    const U128 m = {PCG_MULT_LO, PCG_MULT_HI};
    return add128(mul128(s, m), inc);
}

__device__ __forceinline__ unsigned long long pcg_output(U128 s) {   // XSL-RR of the new state
    const unsigned long long x = s.hi ^ s.lo;
    const unsigned r = (unsigned)(s.hi >> 58);
    return (x >> r) | (x << ((64u - r) & 63u));
}

// ---- the ziggurat --------------------------------------------------------------------------------
__device__ __forceinline__ bool zig_special(unsigned r) {
    return ((r >> 9) & 0x7fffffu) >= ZIG_KI[r & 0xffu];
}

__device__ __forceinline__ float zig_value(unsigned r) {   // rabs * wi[layer], signed
    const float x = __fmul_rn((float)((r >> 9) & 0x7fffffu), __uint_as_float(ZIG_WI[r & 0xffu]));
    return (r & 0x100u) ? -x : x;
}

__device__ __forceinline__ float next_float(unsigned w) {   // (w >> 8) * 2^-24, exact
    return __fmul_rn((float)(w >> 8), 5.9604644775390625e-8f);
}

// |a - b| in ulps, both finite and of one sign: their bit patterns are ordered like the values.
__device__ __forceinline__ bool within_ulps(double a, double b, int window) {
    const long long d = __double_as_longlong(a) - __double_as_longlong(b);
    return (d < 0 ? -d : d) <= (1ll << window);
}

// glibc's log1pf (fdlibm, float arithmetic) for x in (-1, 0], operation for operation; the
// branches for x > 0, x <= -1 and 0 < |x| < 2^-29 cannot occur for x = -k 2^-24.
__device__ float log1pf_fdlibm(float x) {
    const int hx = __float_as_int(x);
    if ((hx & 0x7fffffff) < 0x31000000) return x;   // only -0.0 here
    int k = 0, hu = 1;
    float f = x, c = 0.0f;
    if (hx > (int)0xbe95f61fu) {                      // x < -0.2929: reduce 1 + x = 2^k (1 + f)
        const float u = __fadd_rn(1.0f, x);
        hu = __float_as_int(u);
        k = (hu >> 23) - 127;                         // < 0: the fdlibm branch k > 0 is unused
        c = __fdiv_rn(__fsub_rn(x, __fsub_rn(u, 1.0f)), u);
        hu &= 0x007fffff;
        float un;
        if (hu < 0x3504f7) {
            un = __int_as_float(hu | 0x3f800000);
        } else {
            k += 1;
            un = __int_as_float(hu | 0x3f000000);
            hu = (0x00800000 - hu) >> 2;
        }
        f = __fsub_rn(un, 1.0f);
    }
    const float kf = (float)k, ln2_hi = __uint_as_float(L1P_LN2_HI), ln2_lo = __uint_as_float(L1P_LN2_LO);
    const float hfsq = __fmul_rn(__fmul_rn(0.5f, f), f);
    if (hu == 0) {                                    // |f| < 2^-20
        if (f == 0.0f) return k == 0 ? 0.0f : __fadd_rn(__fmul_rn(kf, ln2_hi), __fadd_rn(c, __fmul_rn(kf, ln2_lo)));
        const float R = __fmul_rn(hfsq, __fsub_rn(1.0f, __fmul_rn(__uint_as_float(L1P_TWO3RD), f)));
        if (k == 0) return __fsub_rn(f, R);
        return __fsub_rn(__fmul_rn(kf, ln2_hi), __fsub_rn(__fsub_rn(R, __fadd_rn(__fmul_rn(kf, ln2_lo), c)), f));
    }
    const float s = __fdiv_rn(f, __fadd_rn(2.0f, f)), z = __fmul_rn(s, s);
    float R = __fmul_rn(z, __uint_as_float(L1P_LP7));
    R = __fmul_rn(z, __fadd_rn(__uint_as_float(L1P_LP6), R));
    R = __fmul_rn(z, __fadd_rn(__uint_as_float(L1P_LP5), R));
    R = __fmul_rn(z, __fadd_rn(__uint_as_float(L1P_LP4), R));
    R = __fmul_rn(z, __fadd_rn(__uint_as_float(L1P_LP3), R));
    R = __fmul_rn(z, __fadd_rn(__uint_as_float(L1P_LP2), R));
    R = __fmul_rn(z, __fadd_rn(__uint_as_float(L1P_LP1), R));
    const float sr = __fmul_rn(s, __fadd_rn(hfsq, R));
    if (k == 0) return __fsub_rn(f, __fsub_rn(hfsq, sr));
    return __fsub_rn(__fmul_rn(kf, ln2_hi), __fsub_rn(__fsub_rn(hfsq, __fadd_rn(sr, __fadd_rn(__fmul_rn(kf, ln2_lo), c))), f));
}

// log1pf correctly rounded, through double; ambiguous when the double lies near a float midpoint.
// x in (-1, 0]: the result is <= 0, and one more in the bit pattern is one ulp further from 0.
__device__ float log1pf_rounded(float x, int window, bool &amb) {
    if (x == 0.0f) return x;
    const double d = log1p((double)x);
    const float f = __double2float_rn(d);
    const float g = __int_as_float(__float_as_int(f) + (d < (double)f ? 1 : -1));   // f's neighbour on d's side
    if (within_ulps(d, 0.5 * ((double)f + (double)g), window)) amb = true;
    return f;
}

__device__ __forceinline__ float numpy_log1pf(float x, int mode, int window, bool &amb) {
    return mode ? log1pf_rounded(x, window, amb) : log1pf_fdlibm(x);
}

// The attempt that would start at word p: words consumed (0: it runs past word W), accepted or
// rejected (a rejected wedge consumes 2 words and yields nothing), its value, and whether a
// libm-dependent comparison on the way was too close to call.
struct Attempt { unsigned cons; bool acc, amb; float value; };

__device__ Attempt zig_attempt(const unsigned *__restrict__ words, unsigned p, unsigned W, int mode, int window) {
    const unsigned r = words[p], layer = r & 0xffu, rabs = (r >> 9) & 0x7fffffu;
    Attempt a = {0u, false, false, zig_value(r)};
    if (layer != 0u) {                   // wedge: accept when a uniform point under the curve
        if (p + 1 >= W) return a;
        const float fi0 = __uint_as_float(ZIG_FI[layer - 1]), fi1 = __uint_as_float(ZIG_FI[layer]);
        const float lhs = __fadd_rn(__fmul_rn(__fsub_rn(fi0, fi1), next_float(words[p + 1])), fi1);
        const double x = (double)a.value, arg = __dmul_rn(__dmul_rn(-0.5, x), x);   // exact: 48-bit product
        a.cons = 2u;
        // Float first (FP64 is slow on a Jetson): expf of the rounded argument is within 6.4e-7 of
        // exp(arg), so outside 2^-18 (or the window, if wider) the double cannot decide otherwise.
        const float ef = expf((float)arg), tol = __fmul_rn(ef, __int_as_float((max(window, 34) - 52 + 127) << 23));
        if (fabsf(__fsub_rn(lhs, ef)) > tol) {
            a.acc = lhs < ef;
            return a;
        }
        const double e = exp(arg);
        a.acc = (double)lhs < e;
        a.amb = within_ulps((double)lhs, e, window);
        return a;
    }
    const float r_f = __uint_as_float(ZIG_R_F), ninv = -__uint_as_float(ZIG_INV_R_F);
    for (unsigned q = p + 1; q + 1 < W; q += 2) {   // tail: x = r + Exp / r, two words per try
        const float xx = __fmul_rn(ninv, numpy_log1pf(-next_float(words[q]), mode, window, a.amb));
        const float yy = -numpy_log1pf(-next_float(words[q + 1]), mode, window, a.amb);
        if (__fadd_rn(yy, yy) > __fmul_rn(xx, xx)) {
            const float v = __fadd_rn(r_f, xx);
            a.value = ((rabs >> 8) & 1u) ? -v : v;   // NumPy takes this bit, not the sign bit
            a.cons = q + 2 - p;
            a.acc = true;
            return a;
        }
    }
    return a;
}

// NCHW index -> the output's layout (C > 0: NHWC with C channels and hw pixels).
__device__ __forceinline__ unsigned noise_dst(unsigned i, unsigned C, unsigned hw) {
    if (C == 0u) return i;
    const unsigned chw = C * hw, b = i / chw, rem = i - b * chw, c = rem / hw;
    return (b * hw + (rem - c * hw)) * C + c;
}

// ---- kernels ---------------------------------------------------------------------------------
// Words 32g .. 32g+31 of the draw. With a buffered half (B = 1) word 0 is NumPy's uinteger and
// the fresh outputs start at word 1, so a group holds 16 + B outputs, the first only in part.
template <int B>
__device__ __forceinline__ void words_group(const NoiseState *st, unsigned *__restrict__ words, unsigned g,
                                            unsigned &special) {
    const U128 inc = {st->inc_lo, st->inc_hi};
    U128 s = {st->s_lo, st->s_hi};
    unsigned long long o[16 + B];
    const long long k0 = (32ll * g - B) >> 1;        // first output of the group; -1: word 0 is buffered
    if (k0 > 0) s = pcg_jump(s, inc, (unsigned long long)k0);
#pragma unroll
    for (int i = 0; i < 16 + B; ++i) {
        if (k0 < 0 && i == 0) {
            o[0] = (unsigned long long)st->uinteger << 32;
            continue;
        }
        s = pcg_step(s, inc);
        o[i] = pcg_output(s);
    }
    unsigned w[32];
#pragma unroll
    for (int t = 0; t < 32; ++t) {
        const unsigned long long v = o[(t + B) >> 1];
        w[t] = ((t + B) & 1) ? (unsigned)(v >> 32) : (unsigned)v;
        if (zig_special(w[t])) special |= 1u << t;
    }
    uint4 *dst = reinterpret_cast<uint4 *>(words + 32u * g);
#pragma unroll
    for (int t = 0; t < 8; ++t) dst[t] = make_uint4(w[4 * t], w[4 * t + 1], w[4 * t + 2], w[4 * t + 3]);
}

extern "C" __global__ void __launch_bounds__(128) noise_words(const NoiseState *__restrict__ st, unsigned *__restrict__ words,
                                                              unsigned *__restrict__ smask, unsigned *__restrict__ hmask,
                                                              int groups, int slot_groups) {
    const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (unsigned)groups) return;
    const unsigned long long slot = (unsigned long long)blockIdx.y * (unsigned)slot_groups;
    st += blockIdx.y;
    words += 32u * slot;
    smask += slot;
    hmask += slot;
    unsigned special = 0u;
    if (st->has_uint32) words_group<1>(st, words, g, special);
    else words_group<0>(st, words, g, special);
    smask[g] = special;
    hmask[g] = 0u;
}

// Exclusive prefix over groups of popc(mask[g]) into pre[g]; returns the total to every thread.
// sh: 33 words of shared memory.
__device__ unsigned group_prefix(const unsigned *mask, unsigned *pre, unsigned G, unsigned *sh) {
    const unsigned per = (G + blockDim.x - 1) / blockDim.x, g0 = min(G, threadIdx.x * per), g1 = min(G, g0 + per);
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    unsigned sum = 0u;
    for (unsigned g = g0; g < g1; ++g) sum += __popc(__ldcg(mask + g));   // L2: hmask was set by atomics
    unsigned incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= (unsigned)o) incl += t;
    }
    if (lane == 31u) sh[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned acc = 0u;
        for (unsigned w = 0; w < blockDim.x / 32u; ++w) {
            const unsigned t = sh[w];
            sh[w] = acc;
            acc += t;
        }
        sh[32] = acc;
    }
    __syncthreads();
    unsigned run = sh[warp] + incl - sum;
    for (unsigned g = g0; g < g1; ++g) {
        pre[g] = run;
        run += __popc(__ldcg(mask + g));
    }
    const unsigned total = sh[32];
    __syncthreads();   // sh is reused by the next call
    return total;
}

// Warp 0 walks the specials in order (records rp/ri/rv: position; consumed | ambiguous << 30 |
// accepted << 31; value bits). 32 specials per step: when no attempt of the step runs over the next
// candidate (the common case) every candidate is a start; otherwise they are resolved in order.
// Returns the words consumed by the n normals; ORs NOISE_* into fl.
__device__ unsigned walk_specials(const unsigned *rp, const unsigned *ri, const unsigned *rv, unsigned S, unsigned n,
                                  unsigned *hmask, float *out, unsigned C, unsigned hw, unsigned &fl) {
    const unsigned lane = threadIdx.x & 31u, full = 0xffffffffu;
    unsigned floor = 0u, h = 0u;
    for (unsigned base = 0; base < S; base += 32u) {
        const unsigned i = base + lane;
        const bool valid = i < S;
        const unsigned p = valid ? rp[i] : 0xffffffffu, info = valid ? ri[i] : 0u;
        const unsigned cons = info & 0xffffffu;
        const bool acc = (info >> 31) != 0u, amb = ((info >> 30) & 1u) != 0u;
        const unsigned end = p + (cons ? cons : 1u);
        const bool cand = valid && p >= floor;
        const unsigned prev_end = __shfl_up_sync(full, end, 1);
        const bool prev_cand = __shfl_up_sync(full, (unsigned)cand, 1) != 0u;
        unsigned starts = __ballot_sync(full, cand);
        if (__any_sync(full, cand && lane > 0u && prev_cand && p < prev_end)) {
            starts = 0u;
            unsigned f = floor;
            const unsigned vmask = __ballot_sync(full, valid);
            for (int j = 0; j < 32; ++j) {
                const unsigned pj = __shfl_sync(full, p, j), ej = __shfl_sync(full, end, j);
                if (((vmask >> j) & 1u) && pj >= f) {
                    starts |= 1u << j;
                    f = ej;
                }
            }
        }
        const bool start = (starts >> lane) & 1u;
        const unsigned holes = start ? cons - (acc ? 1u : 0u) : 0u;
        unsigned incl = holes;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned t = __shfl_up_sync(full, incl, o);
            if (lane >= (unsigned)o) incl += t;
        }
        const unsigned hb = h + incl - holes, oi = p - hb;   // holes and normals before p
        const bool done_before = start && oi >= n;            // the n-th normal came from a plain word
        const bool short_words = start && !done_before && cons == 0u;
        const bool last = start && !done_before && !short_words && acc && oi == n - 1u;
        const unsigned stops = __ballot_sync(full, done_before || short_words || last);
        const unsigned first = stops ? (unsigned)(__ffs(stops) - 1) : 32u;
        if (start && (lane < first || (lane == first && last))) {
            if (amb) fl |= NOISE_AMBIGUOUS;
            if (acc) out[noise_dst(oi, C, hw)] = __uint_as_float(rv[i]);
            for (unsigned q = p + (acc ? 1u : 0u); q < p + cons; ++q) atomicOr(&hmask[q >> 5], 1u << (q & 31u));
        }
        if (first < 32u) {
            if (__shfl_sync(full, (unsigned)short_words, first)) fl |= NOISE_SHORT;
            const unsigned hf = __shfl_sync(full, hb, first), ef = __shfl_sync(full, p + cons, first);
            return __shfl_sync(full, (unsigned)last, first) ? ef : n + hf;
        }
        if (starts) floor = __shfl_sync(full, end, 31 - __clz(starts));
        h += __shfl_sync(full, incl, 31);
    }
    return n + h;   // every normal after the last special came from a plain word
}

extern "C" __global__ void __launch_bounds__(256) noise_walk(NoiseState *__restrict__ st, const unsigned *__restrict__ words,
                                                             const unsigned *__restrict__ smask, unsigned *__restrict__ hmask,
                                                             unsigned *__restrict__ spre, unsigned *__restrict__ hpre,
                                                             unsigned *__restrict__ rp, unsigned *__restrict__ ri,
                                                             unsigned *__restrict__ rv, int groups, int cap, unsigned W,
                                                             unsigned n, float *__restrict__ out, int C, int hw,
                                                             int slot_groups, int slot_cap, unsigned long long out_stride) {
    __shared__ unsigned sh[33];
    __shared__ unsigned consumed, flags;
    const unsigned G = (unsigned)groups;
    const unsigned long long slot = (unsigned long long)blockIdx.x * (unsigned)slot_groups,
                             rslot = (unsigned long long)blockIdx.x * (unsigned)slot_cap;
    st += blockIdx.x;
    words += 32u * slot;
    smask += slot;
    hmask += slot;
    spre += slot;
    hpre += slot;
    rp += rslot;
    ri += rslot;
    rv += rslot;
    out += blockIdx.x * out_stride;
    const int mode = st->log1pf_mode, window = st->window;
    // 1. the specials in stream order, each evaluated as an attempt start
    const unsigned S = group_prefix(smask, spre, G, sh);
    const unsigned per = (G + blockDim.x - 1) / blockDim.x, g0 = min(G, threadIdx.x * per), g1 = min(G, g0 + per);
    for (unsigned g = g0; g < g1; ++g) {
        unsigned m = smask[g], i = spre[g];
        for (; m && i < (unsigned)cap; m &= m - 1u, ++i) {
            const unsigned p = 32u * g + (unsigned)(__ffs(m) - 1);
            const Attempt a = zig_attempt(words, p, W, mode, window);
            rp[i] = p;
            ri[i] = a.cons | (a.amb ? 1u << 30 : 0u) | (a.acc ? 1u << 31 : 0u);
            rv[i] = __float_as_uint(a.value);
        }
    }
    __syncthreads();
    // 2. one warp walks them: values of the specials that start attempts, holes, words consumed
    if (threadIdx.x < 32) {
        unsigned fl = S > (unsigned)cap ? NOISE_SHORT : 0u;
        const unsigned used = walk_specials(rp, ri, rv, min(S, (unsigned)cap), n, hmask, out, (unsigned)C, (unsigned)hw, fl);
        if (used >= W) fl |= NOISE_SHORT;   // the state update below reads word `used`
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) fl |= __shfl_xor_sync(0xffffffffu, fl, o);
        if (threadIdx.x == 0) {
            consumed = used;
            flags = fl;
        }
    }
    __syncthreads();
    // 3. holes before each group of 32 words (noise_emit), and the state after `consumed` words
    group_prefix(hmask, hpre, G, sh);
    if (threadIdx.x == 0) {
        st->flags |= flags;
        st->consumed = consumed;
        if (!(flags & NOISE_SHORT)) {
            const unsigned fresh = consumed - st->has_uint32;   // words taken from new outputs
            const U128 s = pcg_jump({st->s_lo, st->s_hi}, {st->inc_lo, st->inc_hi}, (fresh + 1u) >> 1);
            st->s_lo = s.lo;
            st->s_hi = s.hi;
            st->has_uint32 = fresh & 1u;   // an odd count leaves the last output's high half buffered
            st->uinteger = words[(fresh & 1u) ? consumed : consumed - 1u];
        }
    }
}

// A warp per 32 words: each plain word (neither special nor hole) is the normal at output index
// p - holes before p.
extern "C" __global__ void __launch_bounds__(256) noise_emit(const unsigned *__restrict__ words,
                                                             const unsigned *__restrict__ smask,
                                                             const unsigned *__restrict__ hmask,
                                                             const unsigned *__restrict__ hpre, int groups, unsigned n,
                                                             float *__restrict__ out, int C, int hw, int slot_groups,
                                                             unsigned long long out_stride) {
    const unsigned g = blockIdx.x * (blockDim.x / 32u) + (threadIdx.x >> 5), lane = threadIdx.x & 31u;
    if (g >= (unsigned)groups) return;
    const unsigned long long slot = (unsigned long long)blockIdx.y * (unsigned)slot_groups;
    words += 32u * slot;
    smask += slot;
    hmask += slot;
    hpre += slot;
    out += blockIdx.y * out_stride;
    const unsigned hm = hmask[g];
    if (((smask[g] | hm) >> lane) & 1u) return;
    const unsigned i = 32u * g + lane - hpre[g] - __popc(hm & ((1u << lane) - 1u));
    if (i < n) out[noise_dst(i, (unsigned)C, (unsigned)hw)] = zig_value(words[32u * g + lane]);
}
