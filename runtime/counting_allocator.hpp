#pragma once
// Bytes of LibTorch CPU storage in use, counted by tag.
//
// NOTE [counting allocator]: install() replaces LibTorch's CPU allocator
// with a counting one (c10::SetCPUAllocator; process-wide, for the rest of
// the process; 64-byte aligned blocks, as LibTorch's own) so that
// every CPU storage allocated from then on is counted — current and peak
// bytes — under the tag of the thread that allocated it (set_thread_tag: a
// small integer such as the DP rank a thread computes for; -1, the default,
// counts under no tag). A storage is uncounted under the tag it was counted
// under, whichever thread frees it, so ranks running as threads of one
// process are measured apart. Storages allocated before install() are not
// counted, nor is memory that does not come from LibTorch's CPU allocator
// (gloo's buffers, the C++ heap).

#include <cstdint>

namespace troupe::runtime {

struct allocation_counts {
  int64_t current = 0; // bytes in use now
  int64_t peak = 0;    // the most in use at once since the last reset
};

class counting_allocator {
public:
  /// Tags 0 .. kTags - 1 (others count under no tag).
  static constexpr int kTags = 64;

  /// Installs the counting allocator (once; later calls return it).
  static counting_allocator& install();
  /// The tag of the calling thread's allocations from now on.
  static void set_thread_tag(int tag);

  allocation_counts counts(int tag) const;
  /// Starts the tag's peak again from its current bytes.
  void reset_peak(int tag);

private:
  counting_allocator() = default;
};

} // namespace troupe::runtime
