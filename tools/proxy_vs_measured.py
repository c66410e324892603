from vllm_selfspec.offline.proxy_vs_measured import main

if __name__ == "__main__":
    main()
