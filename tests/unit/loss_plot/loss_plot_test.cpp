// The samples' PNG encoder and loss plot (samples/loss_plot). The checksums against published
// check values, the file against bytes computed independently (Python's zlib), the stored deflate
// blocks by inflating them here; the plot's reading of a kiln metrics file and its pixels.
// Samples.CharGptLearnsRealTextAndResumes decodes a real plot with Python's zlib.
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "loss_plot.h"
#include "png.h"

namespace {

uint32_t u32_at(const std::string& s, size_t at) {  // big-endian
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(s[at + i]);
  return v;
}

// The zlib stream of stored blocks, inflated: the blocks' bytes in order; checks every header.
std::string inflate_stored(const std::string& zlib) {
  EXPECT_EQ(static_cast<uint8_t>(zlib[0]), 0x78);
  EXPECT_EQ((static_cast<uint8_t>(zlib[0]) * 256 + static_cast<uint8_t>(zlib[1])) % 31, 0) << "zlib check bits";
  std::string out;
  size_t at = 2;
  for (bool last = false; !last;) {
    last = zlib.at(at) & 1;
    EXPECT_EQ(zlib[at] & 6, 0) << "BTYPE 00 (stored)";
    const unsigned len = static_cast<uint8_t>(zlib[at + 1]) | static_cast<uint8_t>(zlib[at + 2]) << 8;
    const unsigned nlen = static_cast<uint8_t>(zlib[at + 3]) | static_cast<uint8_t>(zlib[at + 4]) << 8;
    EXPECT_EQ(len ^ nlen, 0xffffu) << "NLEN is LEN's one's complement";
    out += zlib.substr(at + 5, len);
    at += 5 + len;
  }
  EXPECT_EQ(u32_at(zlib, at), loss_plot::adler32(out.data(), out.size()));
  EXPECT_EQ(at + 4, zlib.size()) << "nothing after the Adler-32";
  return out;
}

TEST(Png, ChecksumsMatchTheirCheckValues) {
  EXPECT_EQ(loss_plot::crc32("123456789", 9), 0xCBF43926u);  // the CRC-32/ISO-HDLC check value
  EXPECT_EQ(loss_plot::crc32("IEND", 4), 0xAE426082u);       // the CRC every PNG ends with
  EXPECT_EQ(loss_plot::crc32("6789", 4, loss_plot::crc32("12345", 5)), 0xCBF43926u) << "a running CRC";
  EXPECT_EQ(loss_plot::crc32("", 0), 0u);
  EXPECT_EQ(loss_plot::adler32("Wikipedia", 9), 0x11E60398u);
  EXPECT_EQ(loss_plot::adler32("", 0), 1u);
}

TEST(Png, OnePixelFileIsByteForByteWhatZlibAndPngSay) {
  const std::string png = loss_plot::encode_png(1, 1, {255, 0, 0});
  // Signature; IHDR (1x1, 8-bit RGB) with its CRC; IDAT: a zlib stream of one final stored block
  // holding the row (filter 0, then the red pixel) and its Adler-32, as Python's zlib computes
  // them; IEND.
  const std::string want =
      std::string("\x89PNG\r\n\x1a\n", 8) +
      std::string("\0\0\0\x0dIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0\x90\x77\x53\xde", 25) +
      std::string("\0\0\0\x0fIDAT\x78\x01\x01\x04\0\xfb\xff\0\xff\0\0\x03\x01\x01\0\x8d\x1d\xe5\x82", 27) +
      std::string("\0\0\0\0IEND\xae\x42\x60\x82", 12);
  EXPECT_EQ(png, want);
}

TEST(Png, HeaderHoldsTheSizeAndEveryChunkItsCrc) {
  std::vector<uint8_t> rgb(3 * 2 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 13);
  const std::string png = loss_plot::encode_png(3, 2, rgb);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(u32_at(png, 16), 3u);
  EXPECT_EQ(u32_at(png, 20), 2u);
  EXPECT_EQ(u32_at(png, 29), 0x1216F14Du) << "IHDR's CRC as Python's zlib.crc32 computes it";
  size_t chunks = 0;
  for (size_t at = 8; at < png.size(); ++chunks) {
    const uint32_t length = u32_at(png, at);
    EXPECT_EQ(u32_at(png, at + 8 + length), loss_plot::crc32(png.data() + at + 4, length + 4)) << png.substr(at + 4, 4);
    at += 12 + length;
  }
  EXPECT_EQ(chunks, 3u);
  EXPECT_EQ(png.substr(png.size() - 12), std::string("\0\0\0\0IEND\xae\x42\x60\x82", 12));
}

TEST(Png, ImageLargerThanOneStoredBlockRoundTrips) {
  const int width = 200, height = 120;  // 120 rows of 601 bytes: a block of 65535 and one of 6585
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7 + i / 601);
  const std::string png = loss_plot::encode_png(width, height, rgb);
  const size_t idat = 33;  // after the signature and IHDR
  ASSERT_EQ(png.substr(idat + 4, 4), "IDAT");
  const std::string raw = inflate_stored(png.substr(idat + 8, u32_at(png, idat)));
  ASSERT_EQ(raw.size(), static_cast<size_t>(height) * (1 + 3 * width));
  for (size_t y = 0; y < static_cast<size_t>(height); ++y) {
    const size_t row = y * (1 + 3 * width);
    EXPECT_EQ(raw[row], 0) << "filter type of row " << y;
    ASSERT_EQ(raw.compare(row + 1, 3 * width, reinterpret_cast<const char*>(rgb.data() + y * 3 * width), 3 * width), 0)
        << "row " << y;
  }
}

TEST(Png, SizeMismatchIsAnError) {
  EXPECT_THROW(loss_plot::encode_png(2, 2, std::vector<uint8_t>(11)), std::invalid_argument);
  EXPECT_THROW(loss_plot::encode_png(0, 1, {}), std::invalid_argument);
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(LossPlot, ReadsTrainingAndEvaluationLossButNotTheSummaryLine) {
  const std::string path =
      temp_file("metrics.jsonl",
                "{\"step\": 5, \"epoch\": 0.1, \"loss\": 3.5, \"learning_rate\": 0.003, \"steps_per_second\": 2.0}\n"
                "{\"step\": 10, \"epoch\": 0.2, \"loss\": 2.5, \"learning_rate\": 0.002, \"steps_per_second\": 2.0}\n"
                "{\"step\": 10, \"epoch\": 0.2, \"eval_loss\": 3.25, \"eval_runtime\": 0.3}\n"
                "{\"step\": 10, \"epoch\": 0.2, \"train_runtime\": 4.0, \"train_loss\": 3.0}\n");
  const auto curves = loss_plot::read_metrics(path);
  EXPECT_EQ(curves.train, (std::vector<std::pair<double, double>>{{5, 3.5}, {10, 2.5}}));
  EXPECT_EQ(curves.eval, (std::vector<std::pair<double, double>>{{10, 3.25}}));
  EXPECT_THROW(loss_plot::read_metrics(temp_file("empty.jsonl", "{\"step\": 1}\n")), std::runtime_error);
  EXPECT_THROW(loss_plot::read_metrics(::testing::TempDir() + "no-such.jsonl"), std::runtime_error);
}

TEST(LossPlot, DrawsBothCurvesFallingLeftToRight) {
  loss_plot::LossCurves curves;
  for (int s = 1; s <= 20; ++s) curves.train.emplace_back(s, 4.0 / s);
  for (int s = 5; s <= 20; s += 5) curves.eval.emplace_back(s, 4.5 / s);
  const int width = 400, height = 300;
  const auto rgb = loss_plot::draw(curves, width, height);
  ASSERT_EQ(rgb.size(), static_cast<size_t>(width * height * 3));
  // Per column, the highest pixel of the training curve's blue and whether the evaluation's orange is there.
  std::vector<int> train_top(width, -1);
  int eval_pixels = 0;
  for (int y = height - 1; y >= 0; --y)
    for (int x = 0; x < width; ++x) {
      const uint8_t* p = &rgb[static_cast<size_t>((y * width + x) * 3)];
      if (p[0] == 31 && p[1] == 119 && p[2] == 180) train_top[static_cast<size_t>(x)] = y;
      if (p[0] == 255 && p[1] == 127 && p[2] == 14) ++eval_pixels;
    }
  int first = 0, last = width - 1;
  while (first < width && train_top[static_cast<size_t>(first)] < 0) ++first;
  while (last >= 0 && train_top[static_cast<size_t>(last)] < 0) --last;
  ASSERT_LT(first, last);
  EXPECT_GT(last - first, width / 2) << "the curve spans the plot";
  EXPECT_LT(train_top[static_cast<size_t>(first)], train_top[static_cast<size_t>(last)] - height / 2)
      << "loss 4 at step 1 is drawn higher than loss 0.2 at step 20";
  EXPECT_GT(eval_pixels, 100);
}

}  // namespace
