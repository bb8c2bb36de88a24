#include "png.h"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace loss_plot {
namespace {

void put_u32(std::string& out, uint32_t value) {  // big-endian, as PNG writes every number
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift & 0xff));
}

// A chunk: the data's length, the type, the data, and the CRC of type and data.
void put_chunk(std::string& out, const char (&type)[5], const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.append(type, 4);
  out += data;
  put_u32(out, crc32(out.data() + start, out.size() - start));
}

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t previous) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t c = ~previous;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ bytes[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t adler32(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < size; ++i) {
    a = (a + bytes[i]) % 65521;
    b = (b + a) % 65521;
  }
  return b << 16 | a;
}

std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0 || rgb.size() != static_cast<size_t>(width) * static_cast<size_t>(height) * 3)
    throw std::invalid_argument("encode_png: " + std::to_string(rgb.size()) + " bytes are not " +
                                std::to_string(width) + "x" + std::to_string(height) + " RGB pixels");
  // The image as PNG filters it: every row starts with its filter type, here 0 (none).
  const size_t row = static_cast<size_t>(width) * 3;
  std::string raw;
  raw.reserve((row + 1) * static_cast<size_t>(height));
  for (size_t y = 0; y < static_cast<size_t>(height); ++y) {
    raw.push_back(0);
    raw.append(reinterpret_cast<const char*>(rgb.data() + y * row), row);
  }
  // zlib: a header (deflate with a 32 KiB window, check bits making it a multiple of 31), stored
  // blocks of at most 65535 bytes (a byte with BFINAL and BTYPE 00, then LEN and its one's
  // complement NLEN, little-endian, then the bytes), and the Adler-32 of the raw data.
  std::string zlib = {'\x78', '\x01'};
  for (size_t at = 0;;) {
    const size_t len = std::min<size_t>(65535, raw.size() - at);
    const bool last = at + len == raw.size();
    zlib.push_back(last ? 1 : 0);
    for (const size_t v : {len, ~len}) {
      zlib.push_back(static_cast<char>(v & 0xff));
      zlib.push_back(static_cast<char>(v >> 8 & 0xff));
    }
    zlib.append(raw, at, len);
    at += len;
    if (last) break;
  }
  put_u32(zlib, adler32(raw.data(), raw.size()));

  std::string header;  // IHDR: the size, 8 bits a channel, colour type 2 (RGB), deflate, no interlacing
  put_u32(header, static_cast<uint32_t>(width));
  put_u32(header, static_cast<uint32_t>(height));
  header.append({8, 2, 0, 0, 0});
  std::string png = "\x89PNG\r\n\x1a\n";  // the signature
  put_chunk(png, "IHDR", header);
  put_chunk(png, "IDAT", zlib);
  put_chunk(png, "IEND", "");
  return png;
}

}  // namespace loss_plot
