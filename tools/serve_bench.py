from vllm_selfspec.offline.serve_bench import main

if __name__ == "__main__":
    main()
