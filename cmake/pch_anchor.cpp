// Anchor translation unit for the shared LibTorch precompiled header.
