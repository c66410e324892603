from vllm_selfspec.offline.draft_cost import main

if __name__ == "__main__":
    main()
