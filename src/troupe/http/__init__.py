"""The HTTP surface: llama.cpp-compatible router routes in front of the relay."""
