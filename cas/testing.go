package cas

// FakeBootIDForTesting makes stores opened from now on read the boot id from path instead of the kernel's, so that
// tests of packages built on cas can stage a restart of the machine; restore undoes it. Not for production use.
func FakeBootIDForTesting(path string) (restore func()) {
	old := bootIDFile
	bootIDFile = path
	return func() { bootIDFile = old }
}
