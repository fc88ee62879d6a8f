# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's GPU devices as the host reports them (gpu_facts): nvidia-smi, rocm-smi, amdgpu sysfs."""
