// The Python module the kernels build: the model (CpuLlama), a drafter head's layer (HeadLayer), packed linear
// layers, the drafting copy's products, and the switches comparisons turn. Part of cpu_llama.cpp's translation unit,
// included after its anonymous namespace.
#pragma once

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: an AVX2 and an AVX-512 build may share one process (tests compare them)
  pybind11::class_<CpuLlama>(m, "CpuLlama", pybind11::module_local())
      .def(pybind11::init<std::vector<int64_t>, double, std::vector<torch::Tensor>, torch::Tensor, torch::Tensor,
                          torch::Tensor, torch::Tensor, torch::Tensor, std::vector<int64_t>, std::vector<torch::Tensor>,
                          std::vector<int64_t>, std::vector<double>, bool, bool, bool>())
      .def(pybind11::init<std::vector<int64_t>, double, std::vector<torch::Tensor>, torch::Tensor, torch::Tensor,
                          torch::Tensor, torch::Tensor, torch::Tensor, std::vector<int64_t>, std::vector<torch::Tensor>,
                          std::vector<int64_t>, std::vector<double>, bool, bool, bool,
                          std::vector<std::vector<int64_t>>>())
      .def("forward", &CpuLlama::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("compact", &CpuLlama::compact)
      .def_property_readonly("screened", &CpuLlama::screened)
      .def_static("matmul", &CpuLlama::matmul);
  m.def("quantized_matmul", [](torch::Tensor x, torch::Tensor w, int64_t bits) {
    return product(x, make_quantized_weight(w, static_cast<int>(bits)));
  }, "x (M, K) @ w (N, K)^T, w in groups of 32 of `bits` 4 or 8, x rounded to int8 (a drafting copy's products)");
  m.def("pack_codes", [](int64_t fmt, torch::Tensor codes, torch::Tensor first, torch::Tensor second,
                         torch::Tensor super_d, torch::Tensor super_m) {
    auto given = [](const torch::Tensor& t) { return t.numel() ? t.contiguous() : torch::Tensor(); };
    return pack_codes({static_cast<int>(fmt), codes.contiguous(), given(first), given(second), given(super_d),
                       given(super_m)});
  }, "a quantized weight's numbers (quantized_layout.h's QCodes; empty tensors where the format has none) packed "
     "for the kernels: uint8 bytes");
  m.def("packed_matmul", [](torch::Tensor x, torch::Tensor packed, int64_t fmt, int64_t N, int64_t K) {
    return product(x, packed_weight(packed, static_cast<int>(fmt), N, K));
  }, "x (M, K) @ W^T for W (N, K) packed in `fmt`, x rounded to int8 per group of 32");
  m.def("packed_rows", [](torch::Tensor packed, int64_t fmt, int64_t N, int64_t K) {
    const Weight w = packed_weight(packed, static_cast<int>(fmt), N, K);
    torch::Tensor out = torch::empty({N, K}, torch::kFloat32);
    for (int64_t n = 0; n < N; ++n)
      dequantized_row(w.qfmt, reinterpret_cast<const uint8_t*>(w.data), n, K, out.data_ptr<float>() + n * K);
    return out;
  }, "the numbers of a packed weight (N, K) as float32, as embedding lookups widen them");
  m.def("amx_available", [] { return amx_permitted(); }, "bfloat16 products run on AMX tiles where allowed");
  m.def("set_amx", [](bool on) { const bool was = amx_enabled; amx_enabled = on; return was; },
        "turns the AMX products on or off (for comparisons); returns the previous setting");
  m.def("set_split_attention", [](bool on) {
    const bool was = split_attention_enabled;
    split_attention_enabled = on;
    return was;
  }, "a drafting copy's attention by pieces of keys (on) or in the target's order (off), for comparisons; returns "
     "the previous setting");
  pybind11::class_<PackedLinear>(m, "PackedLinear", pybind11::module_local())
      .def(pybind11::init<torch::Tensor, torch::Tensor, bool, int64_t>(), pybind11::arg("weight"), pybind11::arg("bias"),
           pybind11::arg("bf16_dot"), pybind11::arg("bits") = 0)
      .def("__call__", &PackedLinear::call, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def_property_readonly("out_features", &PackedLinear::out_features)
      .def_property_readonly("in_features", &PackedLinear::in_features);
  pybind11::class_<HeadLayer>(m, "HeadLayer", pybind11::module_local())
      .def(pybind11::init<std::vector<int64_t>, double, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                          torch::Tensor, torch::Tensor, torch::Tensor, bool, int64_t>(),
           pybind11::arg("dims"), pybind11::arg("eps"), pybind11::arg("input_norm"), pybind11::arg("qkv"),
           pybind11::arg("o"), pybind11::arg("post_norm"), pybind11::arg("gate_up"), pybind11::arg("down"),
           pybind11::arg("inv_freq"), pybind11::arg("bf16_dot"), pybind11::arg("bits") = 0)
      .def("forward", &HeadLayer::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("forward_each", &HeadLayer::forward_each, pybind11::call_guard<pybind11::gil_scoped_release>());
}
