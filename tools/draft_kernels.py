"""The kernel table of a model's linear layers on this machine (vllm_selfspec/offline/draft_kernels.py)."""

from vllm_selfspec.offline.draft_kernels import main

if __name__ == "__main__":
    main()
