# Loads a Vagrantfile with REAL Vagrant and the REAL vagrant-libvirt provider (Debian packages
# vagrant, vagrant-libvirt) -- the same config loading and finalizing `vagrant up` does, without
# starting anything -- and prints the libvirt provider's settings and the provisioners as JSON.
#   ruby vagrant_config.rb PROJECT_DIR
require "json"
require "vagrant"

env = Vagrant::Environment.new(cwd: ARGV.fetch(0))
machine = env.machine(env.primary_machine_name, :libvirt)
libvirt = machine.provider_config
provisioners = machine.config.vm.provisioners.map do |p|
  c = p.config
  {
    name: p.name.to_s, type: p.type.to_s, reboot: c.respond_to?(:reboot) ? c.reboot : nil,
    env: c.env, args: c.args, inline: c.inline, path: c.path
  }
end
puts JSON.generate(
  provider: machine.provider_name.to_s,
  machine_type: libvirt.machine_type,
  driver: libvirt.driver,
  memory: libvirt.memory,
  cpus: libvirt.cpus,
  nic_model_type: libvirt.nic_model_type,
  qemu_args: libvirt.qemu_args.map { |a| a[:value] },
  provisioners: provisioners
)
