"""pipespec: hierarchical speculative decoding (greedy, synchronous chain SD, PipeSpec)."""
