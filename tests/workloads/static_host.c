/* gpuflight test workload: a program whose CUDA work is all inside a shared object that
 * carries its own (static, hidden) runtime: libnvccapp.so = nvccstyle.c + fwdcudart.c.
 * Same arguments and calls as nvccstyle. */
int nvccstyle_main(int argc, char **argv);

int main(int argc, char **argv)
{
	return nvccstyle_main(argc, argv);
}
