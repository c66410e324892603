from vllm_selfspec.offline.bench import main

if __name__ == "__main__":
    main()
