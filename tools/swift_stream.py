from vllm_selfspec.offline.swift_stream import main

if __name__ == "__main__":
    main()
