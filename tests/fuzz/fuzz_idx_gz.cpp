// Fuzzes data::read_idx on gzip files: the input is an IDX file that the harness compresses first, so
// mutations reach the IDX header and data behind gzip (mutating compressed bytes mostly breaks the
// deflate stream). This is the reader's path where the file size says nothing about the data size.
#include "fuzz_file.h"
#include "memtrain/data/idx.h"

#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // gzip framing (windowBits 15 + 16); Z_BEST_SPEED: compression ratio does not matter here.
  z_stream zs{};
  if (deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::vector<std::uint8_t> gz(deflateBound(&zs, static_cast<uLong>(size)));
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = static_cast<uInt>(size);
  zs.next_out = gz.data();
  zs.avail_out = static_cast<uInt>(gz.size());
  if (deflate(&zs, Z_FINISH) != Z_STREAM_END) std::abort();
  gz.resize(zs.total_out);
  deflateEnd(&zs);

  const memtrain::fuzz::FuzzFile file("images.idx.gz", gz.data(), gz.size());
  try {
    (void)memtrain::data::read_idx(file.path());
  } catch (const std::exception&) {
  }
  return 0;
}
