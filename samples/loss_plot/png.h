// A minimal PNG encoder, so that the samples can draw a picture without an image library: 8-bit
// RGB, one IDAT chunk holding a zlib stream of deflate "stored" (uncompressed) blocks. Every PNG
// reader decodes it; the file is as large as the pixels (about 1.2 MB for 800x500), which is fine
// for a plot written once per training run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loss_plot {

// CRC-32 as PNG and zlib compute it (polynomial 0xEDB88320, reflected, inverted before and after).
// Pass the previous result as `previous` to continue a running CRC over several pieces.
uint32_t crc32(const void* data, size_t size, uint32_t previous = 0);

// Adler-32 as zlib computes it (the checksum that ends a zlib stream).
uint32_t adler32(const void* data, size_t size);

// The bytes of a PNG file of `rgb`: width * height pixels of three bytes (red, green, blue), rows
// from the top. Throws std::invalid_argument when the sizes do not agree.
std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace loss_plot
