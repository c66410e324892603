from vllm_selfspec.offline.train_layerskip import main

if __name__ == "__main__":
    main()
