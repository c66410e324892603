from vllm_selfspec.offline.build_bigram import main

if __name__ == "__main__":
    main()
