"""What the linear layers of one engine step cost by its tokens (vllm_selfspec/offline/step_cost.py)."""

from vllm_selfspec.offline.step_cost import main

if __name__ == "__main__":
    main()
