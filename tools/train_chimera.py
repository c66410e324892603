from vllm_selfspec.offline.train_chimera import main

if __name__ == "__main__":
    main()
