from vllm_selfspec.offline.draft_cost_hf import main

if __name__ == "__main__":
    main()
