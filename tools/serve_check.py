from vllm_selfspec.offline.serve_check import main

if __name__ == "__main__":
    main()
