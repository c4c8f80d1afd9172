package scan

// allowed is every callable a pickle may import and still be data: what torch.save writes for a state dict of
// tensors (and what numpy writes for a plain array), each with why loading it runs nothing the file chooses. It is
// an allowlist because the other way round fails: arXiv 2508.19774 counts 133 exploitable gadgets in the standard
// library and common packages, and every denylist scanner it tried missed most of them. Anything not here is code,
// named in the report. Names are module + "." + qualified name after CPython's Python 2 import mapping.
//
// The list follows torch.load(weights_only=True)'s own (torch/_weights_only_unpickler.py), minus what a state dict
// does not need.
var allowed = map[string]string{
	// torch.save of a tensor: __reduce_ex__ returns one of these rebuild helpers with the storage (a persistent id
	// torch's own persistent_load resolves to raw bytes of the archive) and sizes, strides, flags.
	"torch._utils._rebuild_tensor":                   "rebuilds a tensor view of a storage (old torch)",
	"torch._utils._rebuild_tensor_v2":                "rebuilds a tensor view of a storage; backward hooks are stored, not called",
	"torch._utils._rebuild_tensor_v3":                "rebuilds a tensor view of a storage with an explicit dtype",
	"torch._utils._rebuild_parameter":                "wraps a rebuilt tensor as nn.Parameter",
	"torch._utils._rebuild_parameter_with_state":     "nn.Parameter with its __dict__ state (setattr only)",
	"torch._utils._rebuild_meta_tensor_no_storage":   "a meta tensor: sizes and dtype, no data",
	"torch._utils._rebuild_device_tensor_from_numpy": "a tensor from an array (data, dtype, device)",
	"torch._utils._rebuild_qtensor":                  "rebuilds a quantized tensor view of a storage",
	// _rebuild_from_type_v2(func, type, args, state) calls func(*args): func is itself a pickled global, so it is
	// checked against this list like every other import.
	"torch._tensor._rebuild_from_type_v2": "re-types a rebuilt tensor; its func argument is an import checked here",
	"torch.Tensor":                        "the tensor type (a _rebuild_from_type_v2 argument)",
	"torch.nn.parameter.Parameter":        "the Parameter type (a _rebuild_from_type_v2 argument)",
	"torch.Size":                          "a tuple subclass of dimensions",
	"torch.device":                        "a device name",
	// Storage types appear in persistent ids ('storage', torch.FloatStorage, key, location, numel): torch's
	// persistent_load only reads them as the element type of raw bytes.
	"torch.UntypedStorage":       "storage element type",
	"torch.FloatStorage":         "storage element type",
	"torch.DoubleStorage":        "storage element type",
	"torch.HalfStorage":          "storage element type",
	"torch.BFloat16Storage":      "storage element type",
	"torch.LongStorage":          "storage element type",
	"torch.IntStorage":           "storage element type",
	"torch.ShortStorage":         "storage element type",
	"torch.CharStorage":          "storage element type",
	"torch.ByteStorage":          "storage element type",
	"torch.BoolStorage":          "storage element type",
	"torch.ComplexFloatStorage":  "storage element type",
	"torch.ComplexDoubleStorage": "storage element type",
	"torch.QUInt8Storage":        "storage element type",
	"torch.QInt8Storage":         "storage element type",
	"torch.QInt32Storage":        "storage element type",
	"torch.QUInt4x2Storage":      "storage element type",
	"torch.QUInt2x4Storage":      "storage element type",
	// dtypes are module attributes (constants), pickled by name.
	"torch.float32": "dtype constant", "torch.float64": "dtype constant", "torch.float16": "dtype constant",
	"torch.bfloat16": "dtype constant", "torch.int64": "dtype constant", "torch.int32": "dtype constant",
	"torch.int16": "dtype constant", "torch.int8": "dtype constant", "torch.uint8": "dtype constant",
	"torch.bool": "dtype constant", "torch.complex64": "dtype constant", "torch.complex128": "dtype constant",
	"torch.float8_e4m3fn": "dtype constant", "torch.float8_e5m2": "dtype constant",
	// A state dict is an OrderedDict (its _metadata attribute comes through BUILD, a setattr).
	"collections.OrderedDict": "the state dict's type: built from (key, value) pairs",
	// numpy arrays pickle as _reconstruct(ndarray, (0,), b'b') followed by BUILD with (version, shape, dtype,
	// fortran, raw bytes); elements of an object array are pickled objects, each checked here.
	"numpy.core.multiarray._reconstruct":  "creates an empty array to BUILD into",
	"numpy._core.multiarray._reconstruct": "numpy 2's name for _reconstruct",
	"numpy.core.multiarray.scalar":        "a numpy scalar from a dtype and its bytes",
	"numpy._core.multiarray.scalar":       "numpy 2's name for scalar",
	"numpy.core.numeric._frombuffer":      "protocol 5 arrays: frombuffer(bytes, dtype).reshape(shape); object dtypes are refused by numpy",
	"numpy._core.numeric._frombuffer":     "numpy 2's name for _frombuffer",
	"numpy.ndarray":                       "the array type (a _reconstruct argument)",
	"numpy.dtype":                         "a dtype from its type string",
	// Protocol 2 pickles carry bytes as _codecs.encode(str, 'latin1') (numpy under Python 3 does): a codec from the
	// standard library's encodings package, a pure transform.
	"_codecs.encode": "bytes as encode(text, 'latin1') in protocol 2 pickles",
	// Containers CPython pickles by calling their type.
	"builtins.set":       "a set from its items",
	"builtins.frozenset": "a frozenset from its items",
	"builtins.bytearray": "a bytearray from its bytes",
	"builtins.complex":   "a complex number",
	"builtins.slice":     "a slice",
}

// Allowed reports whether a pickle may import callable (module.name) and stay data, and why.
func Allowed(callable string) (why string, ok bool) {
	why, ok = allowed[callable]
	return why, ok
}
