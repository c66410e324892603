from vllm_selfspec.offline.corpus import main

if __name__ == "__main__":
    main()
