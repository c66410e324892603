from vllm_selfspec.offline.layout_masks import main

if __name__ == "__main__":
    main()
