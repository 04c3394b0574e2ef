/*!
 * \file digest.h
 * \brief The integrity digest of region documents and their constants (docs/region-format.md,
 *        "Integrity").
 *
 * FNV-1a over 64-bit words (the length mixed into the start, a zero-padded tail word), then a
 * murmur3 finalizer.  Each step h -> (h ^ w) * P with P odd is a bijection of h, so two inputs of
 * one length that differ within a single 8-byte word (a flipped bit, a burst of up to 8 bytes)
 * always have different digests; other differences collide with probability about 2^-64.  It
 * catches damage, not tampering (no key, not cryptographic), at one multiply per 8 bytes, so the
 * constants of a large model are checked in well under a second at load.
 */
#ifndef BYOC_HETERO_DIGEST_H_
#define BYOC_HETERO_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace byoc_hetero {

inline uint64_t Digest(const void* data, size_t size) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(size);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
  }
  if (i < size) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, size - i);
    h = (h ^ w) * kPrime;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

/*! \brief The digest as 16 lower-case hex digits (how documents write it). */
inline std::string DigestHex(uint64_t h) {
  static const char* kHex = "0123456789abcdef";
  std::string s(16, '0');
  for (int k = 15; k >= 0; --k, h >>= 4) s[k] = kHex[h & 0xf];
  return s;
}

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_DIGEST_H_
