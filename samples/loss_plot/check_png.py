#!/usr/bin/env python3
"""Checks a loss plot drawn by loss_plot.cpp with nothing but Python's standard library: the PNG
decodes (signature, every chunk's CRC, the IDAT zlib stream inflated by zlib itself, whose Adler-32
it checks), it is WIDTH x HEIGHT 8-bit RGB, the training-loss curve (blue) and the evaluation-loss
curve (orange) run unbroken across most of the plot, the training curve falls from left to right,
and there are tick labels left of the plot and under it.

    check_png.py loss.png WIDTH HEIGHT
"""
import struct
import sys
import zlib

TRAIN, EVAL, INK = (31, 119, 180), (255, 127, 14), (40, 40, 40)


def fail(why):
    sys.exit(f"FAIL: {sys.argv[1]}: {why}")


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("no PNG signature")
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            fail(f"chunk {kind!r} has a bad CRC")
        chunks.append((kind, body))
        at += 12 + length
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        fail("IHDR is not first or IEND is not last")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if (depth, colour, interlace) != (8, 2, 0):
        fail(f"not 8-bit RGB without interlacing: depth {depth}, colour type {colour}, interlace {interlace}")
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = 1 + 3 * width
    if len(raw) != height * stride:
        fail(f"{len(raw)} bytes of image data for {width}x{height}")
    if any(raw[y * stride] != 0 for y in range(height)):
        fail("a row uses a filter other than none, which loss_plot.cpp does not write")
    pixels = [[tuple(raw[y * stride + 1 + 3 * x:y * stride + 4 + 3 * x]) for x in range(width)] for y in range(height)]
    return width, height, pixels


def curve(pixels, colour, width, name):
    """Columns holding the colour, each with the mean row of its pixels; fails unless they run
    unbroken (a gap of at most 2 columns) across at least 40% of the image."""
    rows = {}
    for y, line in enumerate(pixels):
        for x, p in enumerate(line):
            if p == colour:
                rows.setdefault(x, []).append(y)
    # The legend's sample line is in this colour too: keep the widest unbroken run of columns.
    runs, run = [], []
    for x in sorted(rows):
        if run and x - run[-1] > 3:
            runs.append(run)
            run = []
        run.append(x)
    runs.append(run)
    best = max(runs, key=len) if rows else []
    if len(best) < 0.4 * width:
        fail(f"the {name} curve spans {len(best)} columns, less than 40% of {width}")
    return [(x, sum(rows[x]) / len(rows[x])) for x in best]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    width, height, pixels = decode(sys.argv[1])
    if (width, height) != (int(sys.argv[2]), int(sys.argv[3])):
        fail(f"{width}x{height}, not {sys.argv[2]}x{sys.argv[3]}")
    train = curve(pixels, TRAIN, width, "training-loss")
    evaluation = curve(pixels, EVAL, width, "evaluation-loss")
    tenth = max(1, len(train) // 10)
    start = sum(y for _, y in train[:tenth]) / tenth
    end = sum(y for _, y in train[-tenth:]) / tenth
    if not end > start + 0.1 * height:
        fail(f"the training-loss curve does not fall: row {start:.0f} at its left end, {end:.0f} at its right")
    # The axes are the longest column and row of ink; the tick labels are ink beyond their tick marks.
    axis_x = max(range(width), key=lambda x: sum(line[x] == INK for line in pixels))
    axis_y = max(range(height), key=lambda y: pixels[y].count(INK))
    ink_left = sum(p == INK for line in pixels for p in line[:axis_x - 6])
    ink_below = sum(line.count(INK) for line in pixels[axis_y + 6:])
    if ink_left < 50 or ink_below < 50:
        fail(f"no tick labels: {ink_left} ink pixels left of the y axis, {ink_below} under the x axis")
    print(f"{sys.argv[1]}: {width}x{height} RGB; training loss over columns {train[0][0]}-{train[-1][0]}, falling "
          f"from row {start:.0f} to {end:.0f}; evaluation loss over columns {evaluation[0][0]}-{evaluation[-1][0]}; "
          f"{ink_left} + {ink_below} pixels of tick labels")


main()
