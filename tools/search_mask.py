from vllm_selfspec.offline.search_mask import main

if __name__ == "__main__":
    main()
