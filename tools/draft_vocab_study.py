from vllm_selfspec.offline.draft_vocab_study import main

if __name__ == "__main__":
    main()
